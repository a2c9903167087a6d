package containerizer

import (
	"errors"
	"testing"
)

func TestParseUser(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     User
		err      bool
	}{
		{name: "uid", in: "1000", want: User{1000, 1000}},
		{name: "uid and gid", in: "1000:20", want: User{1000, 20}},
		{name: "root", in: "0:0", want: User{0, 0}},
		{name: "empty", in: "", err: true},
		{name: "name", in: "nobody", err: true},
		{name: "empty gid", in: "1000:", err: true},
		{name: "negative", in: "-1", err: true},
		{name: "too big", in: "4294967296", err: true},
		{name: "largest id", in: "4294967294:4294967294", want: User{4294967294, 4294967294}},
		{name: "uid is -1", in: "4294967295", err: true},
		{name: "gid is -1", in: "1000:4294967295", err: true},
		{name: "uid is -1 with a gid", in: "4294967295:0", err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseUser(tc.in)
			if tc.err {
				if !errors.Is(err, ErrInvalidSpec) {
					t.Fatalf("ParseUser(%q) = %v, %v; want ErrInvalidSpec", tc.in, got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ParseUser(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
			}
		})
	}
}
