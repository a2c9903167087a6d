package main

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
)

// asGpuinfoEnv makes the test binary run as gpuinfo (TestNeedsRoot).
const asGpuinfoEnv = "GPUISO_TEST_AS_GPUINFO"

func TestMain(m *testing.M) {
	if os.Getenv(asGpuinfoEnv) != "" {
		main()
	}
	os.Exit(m.Run())
}

// TestNeedsRoot runs gpuinfo --simulate as nobody: one line saying it
// needs root and what to do, exit 125, no panic, nothing left in TMPDIR.
func TestNeedsRoot(t *testing.T) {
	testenv.RequireRoot(t)
	dir, err := os.MkdirTemp("/tmp", "gpuinfo-nobody-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(dir, "gpuinfo")
	copyFile(t, exe)
	tmp := filepath.Join(dir, "tmp")
	if err := os.Mkdir(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(tmp, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"--simulate", "dgx1-volta"}, {"--simulate", "hgx-h100-mig", "--json"}} {
		cmd := exec.Command(exe, args...)
		cmd.Env = append(os.Environ(), asGpuinfoEnv+"=1", "TMPDIR="+tmp)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		var out, errOut testenv.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		cmd.Run()
		msg := errOut.String()
		if code := cmd.ProcessState.ExitCode(); code != 125 || out.String() != "" || strings.Count(msg, "\n") != 1 ||
			!strings.HasPrefix(msg, "gpuinfo: needs root (") || !strings.Contains(msg, "run it as root") {
			t.Errorf("gpuinfo %q as nobody: exit %d, stdout %q, stderr %q; want 125 and one line saying it needs root", args, code, out.String(), msg)
		}
		if left, _ := os.ReadDir(tmp); len(left) != 0 {
			t.Errorf("gpuinfo %q as nobody left %s in TMPDIR", args, left[0].Name())
		}
	}
}

func copyFile(t *testing.T, dst string) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	in, err := os.Open(self)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestDevRootOfHostTree: --dev-root is a directory of device nodes in
// every program; one that holds a simulated node's host tree (what
// gpuiso-runtime's and nvcdi's --sim-root name) is refused in one line
// naming --sim-root, not read as an empty device directory.
func TestDevRootOfHostTree(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, ".gpuiso-simulated-host"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	_, errOut, code := gpuinfo(t, "--simulate", "pcie8", "--dev-root", dir)
	if code != 125 || strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, "--sim-root "+dir) {
		t.Errorf("exit %d, stderr %q; want 125 and one line naming --sim-root %s", code, errOut, dir)
	}
	for name, args := range map[string][]string{
		"sim root without simulate": {"--sim-root", dir},
		"sim root with dev root":    {"--simulate", "pcie8", "--sim-root", dir, "--proc-root", dir},
		"relative sim root":         {"--simulate", "pcie8", "--sim-root", "sim"},
	} {
		if _, errOut, code := gpuinfo(t, args...); code != 125 || strings.Count(errOut, "\n") != 1 || !strings.HasPrefix(errOut, "gpuinfo: ") {
			t.Errorf("%s: exit %d, stderr %q; want a usage error", name, code, errOut)
		}
	}
}

// TestSimRoot: --sim-root shows the simulated node whose host tree is in
// that directory (made there when missing), with its own majors; a
// directory another user made is refused in one line, naming it.
func TestSimRoot(t *testing.T) {
	testenv.RequireRoot(t)
	dir := filepath.Join(t.TempDir(), "sim")
	out, errOut, code := gpuinfo(t, "--simulate", "pcie8", "--sim-root", dir)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	ctl := regexp.MustCompile(`(?m)^\s+nvidiactl\s+(\d+):255\s`).FindStringSubmatch(out)
	if ctl == nil || ctl[1] == "195" {
		t.Errorf("nvidiactl shown as %v, want the simulated tree's major:\n%s", ctl, out)
	}
	if _, err := os.Stat(filepath.Join(dir, "dev", "nvidiactl")); err != nil {
		t.Errorf("the tree was not kept in --sim-root: %v", err)
	}
	again, errOut, code := gpuinfo(t, "--simulate", "pcie8", "--sim-root", dir)
	if code != 0 || again != out {
		t.Errorf("a second gpuinfo of the same tree: exit %d, %s\n%s\nwant\n%s", code, errOut, again, out)
	}

	theirs := filepath.Join(t.TempDir(), "theirs")
	if err := os.Mkdir(theirs, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(theirs, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	_, errOut, code = gpuinfo(t, "--simulate", "pcie8", "--sim-root", theirs)
	if code != 125 || strings.Count(errOut, "\n") != 1 || !strings.HasPrefix(errOut, "gpuinfo: ") || !strings.Contains(errOut, "owned by uid 65534") {
		t.Errorf("--sim-root of nobody's directory: exit %d, stderr %q; want one line refusing it", code, errOut)
	}
	if left, _ := os.ReadDir(theirs); len(left) != 0 {
		t.Errorf("made %s in nobody's directory", left[0].Name())
	}
}
