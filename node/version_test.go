package node

import (
	"errors"
	"fmt"
	"testing"
)

func TestCompareVersions(t *testing.T) {
	tests := []struct {
		a, b string
		want int
	}{
		{"418", "418.87.01", -1}, {"419", "418.87.01", 1}, {"12.2", "12.10", -1},
		{"8.0", "8", 0}, {"535.309.01", "535.309.1", 0}, {"10", "9", 1},
	}
	for _, tt := range tests {
		t.Run(tt.a+" vs "+tt.b, func(t *testing.T) {
			if got := CompareVersions(tt.a, tt.b); got != tt.want {
				t.Fatalf("CompareVersions = %d, want %d", got, tt.want)
			}
		})
	}
}

func TestOpHolds(t *testing.T) {
	tests := []struct {
		op              Op
		less, eq, great bool
	}{
		{OpEqual, false, true, false}, {OpNotEqual, true, false, true},
		{OpLess, true, false, false}, {OpLessEqual, true, true, false},
		{OpGreater, false, false, true}, {OpGreaterEqual, false, true, true},
		{"regexp", false, false, false},
	}
	for _, tt := range tests {
		t.Run(string(tt.op), func(t *testing.T) {
			if got := [3]bool{tt.op.Holds(-1), tt.op.Holds(0), tt.op.Holds(1)}; got != [3]bool{tt.less, tt.eq, tt.great} {
				t.Fatalf("Holds(-1,0,1) = %v", got)
			}
		})
	}
}

func TestParseVersion(t *testing.T) {
	tests := []struct {
		in   string
		want Version
		err  bool
	}{
		{"535.104.05", Version{535, 104, 5}, false},
		{" v12.2 ", Version{12, 2}, false},
		{"1.44", Version{1, 44}, false},
		{"", nil, true},
		{"12..2", nil, true},
		{"12.x", nil, true},
		{"-1.2", nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseVersion(tt.in)
			if (err != nil) != tt.err || fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Fatalf("ParseVersion = %v, %v", got, err)
			}
			if err != nil && !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not match ErrInvalid", err)
			}
		})
	}
	if c := (Version{535, 104, 5}).Compare(Version{535, 104, 5, 0}); c != 0 {
		t.Errorf("Compare with a trailing zero = %d", c)
	}
	if c := (Version{1, 43}).Compare(Version{1, 44}); c != -1 {
		t.Errorf("1.43 vs 1.44 = %d", c)
	}
}
