package volume

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
)

// These tests build volumes from the host's own NVIDIA driver. They need
// root (hard-linking files of other users, mounting tmpfs) and the driver's
// user-space part.

// hostLibraries lists the driver's library files of version installed on
// the host, found from the directory of libnvidia-ml.so.1 and of the file
// it resolves to.
func hostLibraries(t *testing.T, mlPath, version string) []string {
	real, err := filepath.EvalSymlinks(mlPath)
	must(t, err)
	seen := map[string]bool{}
	var names []string
	for _, dir := range []string{filepath.Dir(mlPath), filepath.Dir(real)} {
		matches, err := filepath.Glob(filepath.Join(dir, "lib*.so."+version))
		must(t, err)
		for _, m := range matches {
			if n := filepath.Base(m); !seen[n] {
				seen[n] = true
				names = append(names, n)
			}
		}
	}
	return names
}

func TestHostVolume(t *testing.T) {
	testenv.RequireRoot(t)
	mlPath := testenv.RequireNVIDIALibraries(t)
	ctx := context.Background()
	m, err := New(WithRoot(filepath.Join(t.TempDir(), "volumes")))
	must(t, err)
	vol, err := m.Build(ctx)
	must(t, err)
	t.Logf("built %s: %d files, %d links; warnings:\n%s", vol.Path, vol.Files, vol.Links, strings.Join(vol.Warnings, "\n"))

	want := []string{"bin/nvidia-smi",
		"lib64/libnvidia-ml.so.1", "lib64/libcuda.so.1", "lib64/libcuda.so", "lib64/libnvidia-ptxjitcompiler.so.1"}
	libs := hostLibraries(t, mlPath, vol.Version)
	for _, l := range libs {
		want = append(want, "lib64/"+l)
	}
	for _, l := range []string{"libnvidia-ml", "libcuda", "libnvidia-ptxjitcompiler"} {
		if !strings.Contains(strings.Join(libs, " "), l+".so."+vol.Version) {
			t.Errorf("host has no %s.so.%s", l, vol.Version)
		}
	}
	for _, p := range want {
		if _, err := os.Stat(filepath.Join(vol.Path, p)); err != nil {
			t.Errorf("volume lacks %s: %v", p, err)
		}
	}
	mf, err := readManifest(vol.Path)
	must(t, err)
	for _, f := range mf.Files {
		if !f.Linked {
			t.Errorf("%s copied, want a hard link (root and driver share a file system)", f.Path)
		}
	}

	// The volume's nvidia-smi, with the volume's libraries, answers as the
	// host's does: there is no kernel driver on this host.
	hostOut, hostErr := exec.Command("nvidia-smi").CombinedOutput()
	cmd := exec.Command(filepath.Join(vol.Path, "bin", "nvidia-smi"))
	cmd.Env = []string{"PATH=/usr/bin:/bin", "LD_LIBRARY_PATH=" + filepath.Join(vol.Path, "lib64") + ":" + filepath.Join(vol.Path, "lib")}
	volOut, volErr := cmd.CombinedOutput()
	if string(hostOut) != string(volOut) || exitCode(hostErr) != exitCode(volErr) {
		t.Fatalf("host nvidia-smi: %q (%v); volume's: %q (%v)", hostOut, hostErr, volOut, volErr)
	}
	if !strings.Contains(string(volOut), "couldn't communicate with the NVIDIA driver") && hostErr != nil {
		t.Fatalf("nvidia-smi said %q", volOut)
	}
	// And it did load NVML from the volume.
	env := cmd.Env
	cmd = exec.Command(filepath.Join(vol.Path, "bin", "nvidia-smi"))
	cmd.Env = append(env, "LD_DEBUG=libs")
	debug, _ := cmd.CombinedOutput()
	if want := filepath.Join(vol.Path, "lib64", "libnvidia-ml.so.1"); !strings.Contains(string(debug), "calling init: "+want) {
		t.Fatalf("volume's nvidia-smi did not load %s:\n%s", want, debug)
	}
}

func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

func TestHostNoexecRootGetsTmpfsAndCopies(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireNVIDIALibraries(t)
	noexec := filepath.Join(t.TempDir(), "noexec")
	must(t, os.Mkdir(noexec, 0o755))
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "noexec,mode=0755", "tmpfs", noexec).CombinedOutput(); err != nil {
		t.Fatalf("mount noexec tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() { linux.Unmount(noexec) })
	root := filepath.Join(noexec, "volumes")
	t.Cleanup(func() { linux.Unmount(root) }) // runs first
	m, err := New(WithRoot(root))
	must(t, err)
	vol, err := m.Build(context.Background())
	must(t, err)
	if ne, err := linux.Noexec(root); err != nil || ne {
		t.Fatalf("root still noexec (%v) after Build", err)
	}
	if magic, err := linux.FilesystemType(root); err != nil || magic != linux.TmpfsMagic {
		t.Fatalf("root file system %#x, %v; want a tmpfs", magic, err)
	}
	mf, err := readManifest(vol.Path)
	must(t, err)
	for _, f := range mf.Files {
		if f.Linked {
			t.Errorf("%s hard-linked across file systems", f.Path)
		}
	}
	must(t, mf.verify(vol.Path, true))
	cmd := exec.Command(filepath.Join(vol.Path, "bin", "nvidia-smi"))
	cmd.Env = []string{"LD_LIBRARY_PATH=" + filepath.Join(vol.Path, "lib64")}
	out, _ := cmd.CombinedOutput()
	if !strings.Contains(string(out), "NVIDIA") {
		t.Fatalf("nvidia-smi from the tmpfs volume: %q", out)
	}
	// A second manager finds the tmpfs and the volume: no second mount.
	m2, err := New(WithRoot(root))
	must(t, err)
	again, err := m2.Build(context.Background())
	if err != nil || again.Built {
		t.Fatalf("second Build = %+v, %v", again, err)
	}
}

func TestHostRootOwnedByAnother(t *testing.T) {
	testenv.RequireRoot(t)
	tr := driverTree(t, "535.309.01")
	m := tr.manager()
	must(t, os.MkdirAll(m.Root(), 0o755))
	must(t, os.Chown(m.Root(), 65534, 65534))
	if _, err := m.Build(context.Background()); !errors.Is(err, ErrUnsafe) {
		t.Fatalf("Build in a root owned by nobody = %v, want ErrUnsafe", err)
	}
	must(t, os.Chown(m.Root(), 0, 0))
	vol, err := m.Build(context.Background())
	must(t, err)
	must(t, os.Chown(vol.Path, 65534, 65534))
	if _, err := m.Build(context.Background()); !errors.Is(err, ErrUnsafe) {
		t.Fatalf("Build over a volume owned by nobody = %v, want ErrUnsafe", err)
	}
	if _, err := m.GC(context.Background()); !errors.Is(err, ErrUnsafe) {
		t.Fatalf("GC of a volume owned by nobody = %v, want ErrUnsafe", err)
	}
	if _, err := os.Stat(vol.Path); err != nil {
		t.Fatalf("GC removed an unsafe volume: %v", err)
	}
}
