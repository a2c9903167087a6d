package hwtest_test

import (
	"bufio"
	"context"
	"io"
	"os"
	"os/exec"
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
	for _, args := range [][]string{{"--alloc"}, {"--alloc", "0"}, {"--alloc", "12x"}, {"--alloc", "1", "w", "extra"},
		{"--spin"}, {"--spin", "0"}, {"--spin", "-1"}, {"--spin", "2s"}, {"--spin", "3601"}, {"--spin", "1", "w", "extra"}} {
		if out, code := runCUDACheck(t, bin, nil, args...); code != 2 || out != "" {
			t.Errorf("cudacheck %q = exit %d, %q; want exit 2 and usage on stderr", args, code, out)
		}
	}
	// Without a device, --alloc and --spin say so as the check does.
	if !driverLoaded() {
		for _, args := range [][]string{{"--alloc", "1"}, {"--spin", "1"}, {"--spin", "1", filepath.Join(t.TempDir(), "go")}} {
			if out, code := runCUDACheck(t, bin, nil, args...); code != cudaNoDevice && code != cudaNoLibrary && code != cudaInit || strings.Count(out, "\n") != 1 {
				t.Errorf("cudacheck %q without a driver = exit %d, %q", args, code, out)
			}
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

// TestCUDACheckSpin runs cudacheck --spin against testdata/cudacheck's
// stand-in libcuda (fakecuda.c), which runs the kernel's arithmetic on the
// host after checking the grid and parameters cudacheck launches it with:
// the result line says how many launches and at what rate, a wrong result
// fails the run, and with a wait file cudacheck says it is ready and
// starts once the file exists. It needs the source tree and gcc.
func TestCUDACheckSpin(t *testing.T) {
	bin := cudaCheck(t)
	lib := buildFakeCUDA(t)
	env := []string{"LD_LIBRARY_PATH=" + lib}
	out, code := runCUDACheck(t, bin, env, "--spin", "1")
	t.Logf("cudacheck --spin 1: exit %d: %s", code, strings.TrimSpace(out))
	if launches, rate, ok := spinRate(out); code != cudaOK || !ok || launches == 0 || rate <= 0 || strings.Count(out, "\n") != 1 {
		t.Errorf("cudacheck --spin 1 = exit %d, %q; want exit 0 and one line of launches and rate", code, out)
	}
	out, code = runCUDACheck(t, bin, append(env, "FAKECUDA_WRONG=1"), "--spin", "1")
	if code != cudaStep || !strings.HasPrefix(out, "cudacheck: failed: device 0: the kernel's thread ") {
		t.Errorf("cudacheck --spin 1 with a wrong result = exit %d, %q; want exit 1 and the thread", code, out)
	}
	out, code = runCUDACheck(t, bin, append(env, "FAKECUDA_NO_DEVICE=1"), "--spin", "1")
	if code != cudaNoDevice || !strings.HasPrefix(out, "cudacheck: no device: ") {
		t.Errorf("cudacheck --spin 1 without a device = exit %d, %q", code, out)
	}

	wait := filepath.Join(t.TempDir(), "go")
	cmd := exec.Command(bin, "--spin", "1", wait)
	cmd.Env = append(os.Environ(), env...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(stdout)
	first, err := r.ReadString('\n')
	if err != nil || first != "cudacheck: spin ready\n" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("cudacheck --spin 1 WAIT first said %q, %v; want it ready", first, err)
	}
	if err := os.WriteFile(wait, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	rest, _ := io.ReadAll(r)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("cudacheck --spin 1 WAIT: %v: %s", err, rest)
	}
	if _, _, ok := spinRate(string(rest)); !ok || strings.Count(string(rest), "\n") != 1 {
		t.Errorf("cudacheck --spin 1 WAIT then said %q; want one result line", rest)
	}
}

// buildFakeCUDA compiles testdata/cudacheck/fakecuda.c into libcuda.so.1 in
// a temporary directory, which it returns.
func buildFakeCUDA(t *testing.T) string {
	t.Helper()
	src, err := filepath.Abs(filepath.Join("..", "..", "..", "testdata", "cudacheck", "fakecuda.c"))
	if err != nil || !isFile(src) {
		t.Skip("no source tree to build the stand-in libcuda from")
	}
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "gcc"
	}
	if _, err := exec.LookPath(cc); err != nil {
		t.Skipf("no C compiler to build the stand-in libcuda: %v", err)
	}
	dir := t.TempDir()
	if b, err := exec.Command(cc, "-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-o", filepath.Join(dir, "libcuda.so.1"), src).CombinedOutput(); err != nil {
		t.Fatalf("build fakecuda: %v\n%s", err, b)
	}
	return dir
}
