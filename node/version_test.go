package node

import "testing"

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
