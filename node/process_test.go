package node_test

import (
	"errors"
	"testing"

	"github.com/gpuiso/gpuiso/node"
)

// TestProcess: a process's text form reads back as itself; anything that
// is not "<pid>.<start>" of a valid process is refused.
func TestProcess(t *testing.T) {
	p := node.Process{Pid: 4242, Start: 987654321}
	if s := p.String(); s != "4242.987654321" {
		t.Fatalf("String = %q", s)
	}
	got, err := node.ParseProcess(p.String())
	if err != nil || got != p {
		t.Fatalf("ParseProcess(%q) = %+v, %v", p.String(), got, err)
	}
	for _, bad := range []string{"", "4242", "4242.", ".5", "0.5", "-1.5", "4242.0", "4242.x", "x.5", "+4242.5", "04242.5", "4242.5.6", "4242.5 ", "4242.18446744073709551616"} {
		if p, err := node.ParseProcess(bad); !errors.Is(err, node.ErrInvalidProcess) || !errors.Is(err, node.ErrInvalid) || p != (node.Process{}) {
			t.Errorf("ParseProcess(%q) = %+v, %v; want ErrInvalidProcess", bad, p, err)
		}
	}
	if (node.Process{}).Valid() || (node.Process{Pid: 1}).Valid() || !p.Valid() {
		t.Error("Valid")
	}
}

// FuzzParseProcess: whatever ParseProcess accepts is a valid process that
// writes back as the very text read.
func FuzzParseProcess(f *testing.F) {
	for _, s := range []string{"1.1", "4242.987654321", "0.5", "+1.2", "1.2.3", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := node.ParseProcess(s)
		if err != nil {
			return
		}
		if !p.Valid() || p.String() != s {
			t.Fatalf("ParseProcess(%q) = %+v, which writes %q", s, p, p.String())
		}
	})
}
