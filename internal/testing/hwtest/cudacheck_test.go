package hwtest_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/volume"
)

// driverLoaded reports whether the NVIDIA kernel driver answers on this host.
func driverLoaded() bool {
	_, err := os.Stat("/proc/driver/nvidia/version")
	return err == nil
}

// TestCUDACheckHost runs cudacheck on the host itself. With a driver it must
// pass on every GPU; without one (a CI host with libcuda but no kernel
// module) it must say so in one line and exit with the matching code, not
// crash.
func TestCUDACheckHost(t *testing.T) {
	bin := cudaCheck(t)
	out, code := runCUDACheck(t, bin, nil)
	t.Logf("cudacheck: exit %d: %s", code, strings.TrimSpace(out))
	if strings.Count(out, "\n") != 1 || !strings.HasPrefix(out, "cudacheck: ") {
		t.Fatalf("cudacheck printed %q, want one line", out)
	}
	prefix := map[int]string{
		cudaOK:        "cudacheck: ok: ",
		cudaStep:      "cudacheck: failed: ",
		cudaNoLibrary: "cudacheck: no libcuda: ",
		cudaNoDevice:  "cudacheck: no device: ",
		cudaInit:      "cudacheck: init failed: ",
	}[code]
	if prefix == "" || !strings.HasPrefix(out, prefix) {
		t.Fatalf("cudacheck exit %d with %q: code and line disagree", code, out)
	}
	switch {
	case driverLoaded() && code != cudaOK:
		t.Fatalf("the NVIDIA driver is loaded but CUDA does not work: %s", out)
	case !driverLoaded() && code == cudaOK:
		t.Fatalf("CUDA works without a loaded driver: %s", out)
	}
}

func TestCUDACheckUsage(t *testing.T) {
	bin := cudaCheck(t)
	missing := filepath.Join(t.TempDir(), "libmissing.so")
	out, code := runCUDACheck(t, bin, nil, "--dlopen", missing)
	if code != cudaStep || !strings.HasPrefix(out, missing+" error: ") || strings.Count(out, "\n") != 1 {
		t.Errorf("cudacheck --dlopen %s = exit %d, %q; want exit 1 and one error line", missing, code, out)
	}
	if out, code := runCUDACheck(t, bin, nil, "--bogus"); code != 2 || out != "" {
		t.Errorf("cudacheck --bogus = exit %d, %q; want exit 2 and usage on stderr", code, out)
	}
	for _, args := range [][]string{{"--alloc"}, {"--alloc", "0"}, {"--alloc", "12x"}, {"--alloc", "1", "w", "extra"}} {
		if out, code := runCUDACheck(t, bin, nil, args...); code != 2 || out != "" {
			t.Errorf("cudacheck %q = exit %d, %q; want exit 2 and usage on stderr", args, code, out)
		}
	}
	// Without a device, --alloc says so as the check does.
	if !driverLoaded() {
		if out, code := runCUDACheck(t, bin, nil, "--alloc", "1"); code != cudaNoDevice && code != cudaNoLibrary && code != cudaInit || strings.Count(out, "\n") != 1 {
			t.Errorf("cudacheck --alloc 1 without a driver = exit %d, %q", code, out)
		}
	}
}

// TestVolumeLibrariesLoad builds the host's driver volume and loads every
// library of its lib64 directory, as a container's dynamic linker would with
// the volume first on its search path. It needs the NVIDIA user-space driver
// only, so it runs on CI hosts and GPU nodes alike.
func TestVolumeLibrariesLoad(t *testing.T) {
	testenv.RequireNVIDIALibraries(t)
	bin := cudaCheck(t)
	m, err := volume.New(volume.WithRoot(filepath.Join(t.TempDir(), "volumes")))
	if err != nil {
		t.Fatal(err)
	}
	vol, err := m.Build(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	lib64 := filepath.Join(vol.Path, "lib64")
	entries, err := os.ReadDir(lib64)
	if err != nil {
		t.Fatal(err)
	}
	var libs []string
	for _, e := range entries {
		if strings.Contains(e.Name(), ".so") {
			libs = append(libs, filepath.Join(lib64, e.Name()))
		}
	}
	if len(libs) == 0 {
		t.Fatalf("volume %s has no libraries in lib64", vol.Path)
	}
	env := []string{"LD_LIBRARY_PATH=" + lib64 + ":" + filepath.Join(vol.Path, "lib")}
	out, code := runCUDACheck(t, bin, env, append([]string{"--dlopen"}, libs...)...)
	loaded := 0
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if strings.HasSuffix(line, " ok") {
			loaded++
			continue
		}
		t.Errorf("volume %s: %s", vol.Version, strings.TrimPrefix(line, lib64+"/"))
	}
	if code != 0 || loaded != len(libs) {
		t.Fatalf("%d of %d libraries in %s load (exit %d)", loaded, len(libs), lib64, code)
	}
	t.Logf("volume %s: all %d libraries in lib64 load", vol.Version, len(libs))
}
