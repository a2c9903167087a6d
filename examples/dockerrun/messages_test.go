package main

import (
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
)

// TestGPUsCount: a negative --gpus is a usage error, before the daemon is
// asked anything.
func TestGPUsCount(t *testing.T) {
	_, errOut, code := dockerrun("--gpus", "-1", "img")
	if code != exitFailed || strings.Count(errOut, "\n") != 1 || !strings.HasPrefix(errOut, "dockerrun: --gpus -1: want 0 or more GPUs") {
		t.Errorf("exit %d, stderr %q; want a usage error naming --gpus -1", code, errOut)
	}
}

// TestNeedsRoot runs dockerrun as nobody: one line saying it needs root,
// exit 125, nothing left in TMPDIR.
func TestNeedsRoot(t *testing.T) {
	testenv.RequireRoot(t)
	dir, err := os.MkdirTemp("/tmp", "dockerrun-nobody-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(dir, "dockerrun")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	in, err := os.Open(self)
	if err != nil {
		t.Fatal(err)
	}
	out, err := os.OpenFile(exe, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err == nil {
		_, err = io.Copy(out, in)
		err = errors.Join(err, out.Close())
	}
	in.Close()
	if err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(dir, "tmp")
	if err := os.Mkdir(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(tmp, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "--simulate", "dgx1-volta", "img")
	cmd.Env = append(os.Environ(), asDockerrunEnv+"=1", "TMPDIR="+tmp)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	var errOut testenv.Buffer
	cmd.Stderr = &errOut
	cmd.Run()
	msg := errOut.String()
	if code := cmd.ProcessState.ExitCode(); code != exitFailed || strings.Count(msg, "\n") != 1 || !strings.HasPrefix(msg, "dockerrun: needs root (") {
		t.Errorf("dockerrun as nobody: exit %d, stderr %q; want %d and one line saying it needs root", code, msg, exitFailed)
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Errorf("left %s in TMPDIR", left[0].Name())
	}
}
