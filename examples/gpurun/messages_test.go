package main

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
)

// TestOperatorMessages: a size without a unit, an impossible count and a
// bad value are usage errors at parse time, before anything is opened: one
// line, gpurun's name first, the flag as given and the values it takes,
// no library prefix, pointing at --help. No root needed.
func TestOperatorMessages(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--gpu-memory", "4096", "--", "true"}, "gpurun: --gpu-memory 4096: a size needs a unit, such as 4096MiB or 4GiB"},
		{[]string{"--gpus", "-1", "--", "true"}, "gpurun: --gpus -1: want 0 or more GPUs"},
		{[]string{"--cpu-affinity", "bogus", "--", "true"}, `gpurun: --cpu-affinity "bogus": want numa`},
		{[]string{"--network", "bogus", "--", "true"}, `gpurun: --network "bogus": want none`},
		{[]string{"--user", "nobody", "--", "true"}, `gpurun: --user "nobody": want a numeric UID`},
	} {
		t.Run(strings.Join(tc.args[:2], " "), func(t *testing.T) {
			_, errOut, code := gpurun(tc.args...)
			if code != exitFailed || strings.Count(errOut, "\n") != 1 || !strings.HasPrefix(errOut, tc.want) ||
				!strings.HasSuffix(errOut, "(see gpurun --help)\n") || strings.Contains(errOut, "invalid") || strings.Count(errOut, tc.args[0]) != 1 {
				t.Errorf("gpurun %q: exit %d, stderr %q; want %d and one line starting %q, pointing at --help", tc.args, code, errOut, exitFailed, tc.want)
			}
		})
	}
}

// TestNeedsRoot runs gpurun as nobody: one line saying it needs root,
// exit 125, no panic, nothing left in TMPDIR; on a simulated node too.
func TestNeedsRoot(t *testing.T) {
	testenv.RequireRoot(t)
	exe := nobodyExecutable(t)
	for _, args := range [][]string{
		{"--simulate", "dgx1-volta", "--", "true"},
		{"--simulate", "dgx1-volta", "--gpu-memory", "4GiB", "--", "true"},
		{"--", "true"},
	} {
		tmp := nobodyDir(t, filepath.Dir(exe))
		cmd := exec.Command(exe, args...)
		cmd.Env = append(os.Environ(), asGpurunEnv+"=1", "TMPDIR="+tmp)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		var out, errOut testenv.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err := cmd.Run()
		code := cmd.ProcessState.ExitCode()
		if code != exitFailed || out.String() != "" || strings.Count(errOut.String(), "\n") != 1 ||
			!strings.HasPrefix(errOut.String(), "gpurun: needs root (") || !strings.HasSuffix(errOut.String(), ": run it as root\n") {
			t.Errorf("gpurun %q as nobody: %v, exit %d, stderr %q; want %d and one line saying it needs root", args, err, code, errOut.String(), exitFailed)
		}
		if left, _ := os.ReadDir(tmp); len(left) != 0 {
			t.Errorf("gpurun %q as nobody left %d entries in TMPDIR (%s)", args, len(left), left[0].Name())
		}
	}
}

// nobodyExecutable is a copy of the test binary that nobody can run, in a
// directory removed at the end of the test.
func nobodyExecutable(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "gpurun-nobody-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	in, err := os.Open(self)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	exe := filepath.Join(dir, "gpurun")
	out, err := os.OpenFile(exe, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	return exe
}

// nobodyDir is a new directory in parent that nobody may write in.
func nobodyDir(t *testing.T, parent string) string {
	t.Helper()
	dir, err := os.MkdirTemp(parent, "tmp-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestNotFoundMessage: a command that is not there is said in gpurun's
// name (the container's init is gpurun's own binary), with what to do.
func TestNotFoundMessage(t *testing.T) {
	testenv.RequireRoot(t)
	v, _ := testenv.RequireDeviceCgroup(t)
	_, errOut, code := gpurun("--simulate", "pcie8", "--cgroup", v, "--quiet", "--", "no-such-command-here")
	if code != 127 || strings.Count(errOut, "\n") != 1 || !strings.HasPrefix(errOut, "gpurun") || strings.Contains(errOut, "gpuiso init") ||
		!strings.Contains(errOut, "no-such-command-here") || !strings.Contains(errOut, "check the command's name") {
		t.Errorf("exit %d, stderr %q; want 127 and one line of gpurun's naming the command and what to do", code, errOut)
	}
}

// TestNUMARefusal: --cpu-affinity numa for a GPU on a NUMA node this host
// lacks is one line in the operator's words (the flag, the node), no
// doubled prefix, ending with what to do.
func TestNUMARefusal(t *testing.T) {
	testenv.RequireRoot(t)
	v, _ := testenv.RequireDeviceCgroup(t)
	if _, err := os.Stat("/sys/devices/system/node/node1"); err == nil {
		t.Skip("this host has NUMA node 1: dgx1-volta's GPU 7 is on a node it has")
	}
	_, errOut, code := gpurun("--simulate", "dgx1-volta", "--devices", "7", "--cpu-affinity", "numa", "--cgroup", v, "--quiet", "--", "true")
	want := "gpurun: --cpu-affinity numa: the GPUs are on NUMA node 1, which this host does not have"
	if code != exitFailed || strings.Count(errOut, "\n") != 1 || !strings.HasPrefix(errOut, want) ||
		!strings.HasSuffix(errOut, "run with --cpu-affinity none\n") || strings.Contains(errOut, "launch ") {
		t.Errorf("exit %d, stderr %q; want %d and %q..., ending with what to do", code, errOut, exitFailed, want)
	}
}
