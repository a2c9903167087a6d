package cli

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestRemoveDeadTemp: the temporary directories of a dead process go, those
// of live ones (and names of another form) stay.
func TestRemoveDeadTemp(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	mine, err := os.MkdirTemp("", TempPattern("gpuiso-node"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(filepath.Base(mine), fmt.Sprintf("gpuiso-node-%d.", os.Getpid())) {
		t.Skipf("no proc file system to name the directory by: %s", mine)
	}
	dead := exec.Command("/bin/true")
	if err := dead.Run(); err != nil {
		t.Skip(err)
	}
	gone := filepath.Join(tmp, fmt.Sprintf("gpuiso-node-%d.1-abc", dead.Process.Pid))
	other := filepath.Join(tmp, "gpuiso-node-xyz")
	for _, d := range []string{gone, other} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	removed, err := RemoveDeadTemp("")
	if err != nil || len(removed) != 1 || removed[0] != gone {
		t.Fatalf("RemoveDeadTemp = %v, %v; want [%s]", removed, err, gone)
	}
	for _, d := range []string{mine, other} {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("%s removed: %v", d, err)
		}
	}
}

// TestRemoveDeadTempIn: the same in a directory of the caller's, for any
// prefix, whatever TMPDIR says.
func TestRemoveDeadTempIn(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("TMPDIR", t.TempDir())
	mine, err := os.MkdirTemp(dir, TempPattern("gpurun-rootfs"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(filepath.Base(mine), fmt.Sprintf("gpurun-rootfs-%d.", os.Getpid())) {
		t.Skipf("no proc file system to name the directory by: %s", mine)
	}
	dead := exec.Command("/bin/true")
	if err := dead.Run(); err != nil {
		t.Skip(err)
	}
	gone := filepath.Join(dir, fmt.Sprintf("gpurun-rootfs-%d.1-abc", dead.Process.Pid))
	node := filepath.Join(dir, fmt.Sprintf("gpuiso-node-%d.1-abc", dead.Process.Pid))
	for _, d := range []string{gone, node} {
		if err := os.MkdirAll(filepath.Join(d, "rootfs", "gpuiso-unpack-1"), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	removed, err := RemoveDeadTempIn(dir, "gpurun-rootfs")
	if err != nil || len(removed) != 1 || removed[0] != gone {
		t.Fatalf("RemoveDeadTempIn = %v, %v; want [%s]", removed, err, gone)
	}
	if removed, err := RemoveDeadTempIn(dir, ""); err != nil || len(removed) != 1 || removed[0] != node {
		t.Fatalf("RemoveDeadTempIn of simulated nodes = %v, %v; want [%s]", removed, err, node)
	}
	if _, err := os.Stat(mine); err != nil {
		t.Errorf("a live process's directory was removed: %v", err)
	}
}
