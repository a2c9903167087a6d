package mps

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/node"
)

// fakeClient is a control client that tells whether the control socket it
// is given is a socket, and what pipe directory it was given.
func fakeClient(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), ControlBinary)
	script := "#!/bin/sh\nif [ -S \"$CUDA_MPS_PIPE_DIRECTORY/control\" ]; then echo \"socket $CUDA_MPS_PIPE_DIRECTORY\"; else echo missing >&2; exit 1; fi\n"
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

// TestControlRefusesLinks: a control socket that the container replaced by
// a link to another socket (another share's daemon) is refused with
// ErrTampered and no client runs; the daemon's own socket is reached
// through the descriptor the manager opened it as, never through the pipe
// directory, and nothing of the manager's is left behind.
func TestControlRefusesLinks(t *testing.T) {
	m, err := New(t.TempDir(), WithControl(fakeClient(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	// Socket paths are limited to 107 bytes: short directories.
	short, err := os.MkdirTemp("/tmp", "mpsc-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(short)
	other := filepath.Join(short, "other")
	l, err := net.Listen("unixpacket", other)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	pipe := filepath.Join(m.dir, "owner-1", "pipe")
	if err := os.MkdirAll(pipe, 0o755); err != nil {
		t.Fatal(err)
	}

	if err := os.Symlink(other, filepath.Join(pipe, "control")); err != nil {
		t.Fatal(err)
	}
	_, err = m.control(context.Background(), pipe, "quit")
	if !errors.Is(err, ErrTampered) || !errors.Is(err, node.ErrUnavailable) {
		t.Fatalf("control through a link to another socket: %v, want ErrTampered", err)
	}

	// The daemon's own socket, put in place by the daemon, is reached.
	if err := os.Remove(filepath.Join(pipe, "control")); err != nil {
		t.Fatal(err)
	}
	own := filepath.Join(short, "own")
	lo, err := net.Listen("unixpacket", own)
	if err != nil {
		t.Fatal(err)
	}
	defer lo.Close()
	if err := os.Link(own, filepath.Join(pipe, "control")); err != nil {
		t.Fatal(err)
	}
	out, err := m.control(context.Background(), pipe, "get_default_active_thread_percentage")
	if err != nil {
		t.Fatal(err)
	}
	if out != "socket /proc/self/fd/3" {
		t.Errorf("the client saw %q, want the socket in the manager's directory", out)
	}
	entries, err := os.ReadDir(m.dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".control-") {
			t.Errorf("left in the manager's directory: %s", e.Name())
		}
	}
}

// TestSweepDropsKilledControls: a process killed while it sent a daemon a
// command leaves the directory its sockets were linked into; Sweep removes
// it once that process is provably dead (or, for a directory that does not
// say whose it is, once it is older than any command), and keeps those of
// live processes, which are in use.
func TestSweepDropsKilledControls(t *testing.T) {
	m, err := New(t.TempDir(), WithControl(fakeClient(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	self, err := linux.Self(m.procRoot)
	if err != nil {
		t.Fatal(err)
	}
	if p := m.controlPattern(); p != controlPrefix+self.String()+"-" {
		t.Fatalf("control's directories are named %q*, want the calling process in the name", p)
	}
	dead := linux.Process{Pid: self.Pid, Start: self.Start + 1} // the same pid, another process
	old := time.Now().Add(-controlMaxAge - time.Minute)
	dirs := map[string]bool{ // name: kept
		controlPrefix + dead.String() + "-1": false,
		controlPrefix + self.String() + "-2": true,
		controlPrefix + "20283":              true,  // unnamed, new
		controlPrefix + "20284":              false, // unnamed, old
		controlPrefix + "garbage.name-3":     true,
		"owner-1":                            true,
	}
	for name := range dirs {
		p := filepath.Join(m.dir, name)
		if err := os.MkdirAll(filepath.Join(p, "sub"), 0o755); err != nil {
			t.Fatal(err)
		}
		if name == controlPrefix+"20284" {
			if err := os.Chtimes(p, old, old); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := m.Sweep(context.Background(), func(string) bool { return true }); err != nil {
		t.Fatal(err)
	}
	for name, kept := range dirs {
		_, err := os.Stat(filepath.Join(m.dir, name))
		if kept && err != nil {
			t.Errorf("%s: removed (%v), want kept", name, err)
		}
		if !kept && err == nil {
			t.Errorf("%s: kept, want removed", name)
		}
	}
}
