package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/node/simnode"
)

// TestSimRootFlag: --sim-root names the simulated node's host tree;
// --dev-root is still read as its old spelling; both, or one without
// --simulate, is a usage error.
func TestSimRootFlag(t *testing.T) {
	for _, args := range [][]string{
		{"--simulate", "pcie8", "--sim-root", "/s", "state", "x"},
		{"--simulate", "pcie8", "--dev-root", "/s", "state", "x"},
		{"--simulate=pcie8", "--sim-root=/s", "state", "x"},
	} {
		s, cmd, _, err := splitArgs(args)
		if err != nil || s.DevRoot != "/s" || cmd != "state" {
			t.Errorf("splitArgs(%q) = %+v, %q, %v; want the tree /s", args, s, cmd, err)
		}
	}
	for _, args := range [][]string{
		{"--simulate", "pcie8", "--sim-root", "/s", "--dev-root", "/d", "state", "x"},
		{"--sim-root", "/s", "state", "x"},
		{"--simulate", "pcie8", "state", "x"},
	} {
		if _, _, _, err := splitArgs(args); !errors.Is(err, ErrUsage) {
			t.Errorf("splitArgs(%q) = %v, want ErrUsage", args, err)
		}
	}
}

// TestSimRootUntrusted: a --sim-root directory another user made, or one
// in a directory others may write in, is refused (simnode.ErrUntrusted)
// and nothing is made in it: that user could otherwise point the
// simulated GPUs at /dev/mem.
func TestSimRootUntrusted(t *testing.T) {
	testenv.RequireRoot(t)
	base := t.TempDir()
	theirs := filepath.Join(base, "theirs")
	open := filepath.Join(base, "open")
	for _, d := range []string{theirs, open} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(theirs, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{theirs, filepath.Join(open, "sim")} {
		_, _, err := openNode(context.Background(), Settings{Simulate: "pcie8", DevRoot: dir})
		if !errors.Is(err, simnode.ErrUntrusted) {
			t.Errorf("--sim-root %s: %v, want simnode.ErrUntrusted", dir, err)
		}
	}
	for _, d := range []string{theirs, open} {
		if left, _ := os.ReadDir(d); len(left) != 0 {
			t.Errorf("made %s in %s", left[0].Name(), d)
		}
	}
}
