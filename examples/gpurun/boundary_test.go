package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
)

// TestBoundary runs a shell as root in `gpurun --simulate dgx1-volta --gpus
// 1` and, from inside, tries what the host offers: its Docker socket, a
// listener on its loopback, an abstract socket, its /tmp, and a directory
// gpurun's caller holds open as fd 9. Every one must fail; `ls
// /proc/self/fd` shows 0, 1, 2 and ls's own; the container's GPU opens.
// With --network host the loopback listener is reachable again (the
// opt-in works).
func TestBoundary(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireDeviceCgroup(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	tcp := testenv.Listen(t, "tcp", "127.0.0.1:0")
	abstract := fmt.Sprintf("gpuiso-boundary-%d", os.Getpid())
	testenv.Listen(t, "unix", "@"+abstract)
	sock := fmt.Sprintf("/run/gpuiso-boundary-%d.sock", os.Getpid())
	testenv.Listen(t, "unix", sock)
	held := t.TempDir()
	dir, err := os.Open(held)
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	planted := fmt.Sprintf("/tmp/gpuiso-boundary-%d", os.Getpid())
	defer os.Remove(planted)
	port := tcp.Addr().(*net.TCPAddr).Port
	// bash's /dev/tcp is not in dash: the probe's own connect is used
	// where the shell has none, through a tiny helper script per target.
	probe := testenv.BuildProbe(t)
	script := strings.Join([]string{
		"ls /proc/self/fd | tr '\\n' ' '; echo",
		"echo planted > " + planted + " && echo tmp-write-ok",
		"ls /dev | grep -c '^nvidia[0-9]'",
		probe + " escape sockets=" + sock + ",/run/docker.sock tcp=127.0.0.1:" + fmt.Sprint(port) + " abstract=" + abstract + " fd=9 | grep -E '^(connect|write-through)'",
	}, "; ")
	run := func(extra ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		args := append([]string{"--simulate", "dgx1-volta", "--gpus", "1", "--quiet"}, extra...)
		cmd := exec.CommandContext(ctx, exe, append(args, "--", "/bin/sh", "-c", script)...)
		cmd.Env = append(os.Environ(), asGpurunEnv+"=1")
		cmd.ExtraFiles = make([]*os.File, 7) // fds 3-8 closed, 9 the held directory
		cmd.ExtraFiles[6] = dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("gpurun %v: %v\n%s", extra, err, out)
		}
		return string(out)
	}
	out := run()
	lines := strings.Split(out, "\n")
	if got := strings.TrimSpace(lines[0]); got != "0 1 2 3" {
		t.Errorf("ls /proc/self/fd in the container = %q, want 0 1 2 3 (ls's own)", got)
	}
	if !strings.Contains(out, "tmp-write-ok") {
		t.Errorf("the container could not write its /tmp:\n%s", out)
	}
	if _, err := os.Stat(planted); err == nil {
		t.Errorf("a file the container wrote to /tmp is on the host's: %s", planted)
	}
	if !strings.Contains(out, "\n1\n") {
		t.Errorf("the container does not see exactly one GPU node:\n%s", out)
	}
	for _, probe := range []string{"connect-host-socket-0", "connect-host-socket-1", "connect-host-loopback", "connect-host-abstract", "write-through-inherited-fd"} {
		for l := range strings.Lines(out) {
			if strings.HasPrefix(l, probe+" ") && strings.TrimSpace(strings.TrimPrefix(l, probe)) == "ok" {
				t.Errorf("from inside the container, %s succeeded", probe)
			}
		}
		if !strings.Contains(out, probe+" ") {
			t.Errorf("no %s result:\n%s", probe, out)
		}
	}
	if _, err := os.Stat(filepath.Join(held, "gpuiso-escape-fd")); err == nil {
		t.Errorf("the container created a file through the inherited fd 9")
	}
	t.Logf("from inside gpurun:\n%s", out)

	if out := run("--network", "host"); !strings.Contains(out, "connect-host-loopback ok") {
		t.Errorf("with --network host, the host's loopback listener is not reachable:\n%s", out)
	}
}
