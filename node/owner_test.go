package node_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/node"
)

// TestOwner: ParseOwner accepts what ValidateOwner accepts and nothing
// else; an Owner read as text is checked as it is read, and one that is
// not valid is not written.
func TestOwner(t *testing.T) {
	tests := []struct {
		name, in string
		ok       bool
	}{
		{"container id", "ctr-1.a_b", true},
		{"longest", strings.Repeat("a", node.MaxOwnerLen), true},
		{"empty", "", false},
		{"too long", strings.Repeat("a", node.MaxOwnerLen+1), false},
		{"leading dash", "-x", false},
		{"slash", "a/b", false},
		{"cgroup file", "cgroup.procs", false},
		{"tasks", "tasks", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := node.ParseOwner(tt.in)
			if (err == nil) != tt.ok || (node.ValidateOwner(tt.in) == nil) != tt.ok {
				t.Fatalf("ParseOwner(%q) = %q, %v", tt.in, o, err)
			}
			if !tt.ok {
				var ie *node.InvalidOwnerError
				if !errors.Is(err, node.ErrInvalidOwner) || !errors.Is(err, node.ErrInvalid) || !errors.As(err, &ie) || o != "" {
					t.Errorf("ParseOwner(%q) = %q, %v; want an InvalidOwnerError", tt.in, o, err)
				}
				if node.Owner(tt.in).Valid() {
					t.Errorf("Owner(%q).Valid", tt.in)
				}
				if b, err := node.Owner(tt.in).MarshalText(); err == nil {
					t.Errorf("MarshalText of %q = %q", tt.in, b)
				}
			}
			var got node.Owner = "before"
			err = got.UnmarshalText([]byte(tt.in))
			switch {
			case tt.ok && (err != nil || got.String() != tt.in || !got.Valid()):
				t.Errorf("UnmarshalText(%q) = %q, %v", tt.in, got, err)
			case !tt.ok && (err == nil || got != "before"):
				t.Errorf("UnmarshalText(%q) = %q, %v; want an error, the value kept", tt.in, got, err)
			}
		})
	}
	if (node.Owner("")).Valid() {
		t.Error("the zero Owner is valid")
	}
}

// FuzzParseOwner: whatever ParseOwner accepts obeys the owner-id rule and
// is the very text read.
func FuzzParseOwner(f *testing.F) {
	for _, s := range []string{"ctr-1", "", "-x", "cgroup.procs", "a/b", "tasks", "a.b_c-d"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		o, err := node.ParseOwner(s)
		if err != nil {
			return
		}
		if o.String() != s || node.ValidateOwner(s) != nil || len(s) > node.MaxOwnerLen {
			t.Fatalf("ParseOwner(%q) = %q", s, o)
		}
	})
}
