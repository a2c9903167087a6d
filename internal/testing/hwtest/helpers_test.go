package hwtest_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/containerizer/native"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
)

func TestMain(m *testing.M) {
	native.Init() // the native containerizer starts this binary as each container's init
	testenv.Main(m)
}

// cudaCheckEnv points the suite at a prebuilt cudacheck.
const cudaCheckEnv = "GPUISO_CUDACHECK"

// cudacheck's exit codes (see testdata/cudacheck/cudacheck.c).
const (
	cudaOK        = 0
	cudaStep      = 1
	cudaNoLibrary = 3
	cudaNoDevice  = 4
	cudaInit      = 5
	cudaAlloc     = 6 // --alloc: the allocation failed
)

// cudaCheck returns the cudacheck binary: the one GPUISO_CUDACHECK names,
// else "cudacheck" next to the test binary, else one built with gcc from
// the source tree.
func cudaCheck(t testing.TB) string {
	t.Helper()
	if p := os.Getenv(cudaCheckEnv); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s: %v", cudaCheckEnv, err)
		}
		return p
	}
	if exe, err := os.Executable(); err == nil {
		if p := filepath.Join(filepath.Dir(exe), "cudacheck"); isFile(p) {
			return p
		}
	}
	return buildCUDACheck(t)
}

// buildCUDACheck compiles testdata/cudacheck with gcc into a temporary
// directory.
func buildCUDACheck(t testing.TB) string {
	t.Helper()
	src, err := filepath.Abs(filepath.Join("..", "..", "..", "testdata", "cudacheck", "cudacheck.c"))
	if err != nil || !isFile(src) {
		t.Skipf("no prebuilt cudacheck (%s) and no source tree to build it from", cudaCheckEnv)
	}
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "gcc"
	}
	if _, err := exec.LookPath(cc); err != nil {
		t.Skipf("no C compiler to build cudacheck: %v", err)
	}
	out := filepath.Join(t.TempDir(), "cudacheck")
	if b, err := exec.Command(cc, "-O2", "-Wall", "-Wextra", "-Werror", "-o", out, src, "-ldl").CombinedOutput(); err != nil {
		t.Fatalf("build cudacheck: %v\n%s", err, b)
	}
	return out
}

func isFile(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular()
}

// runCUDACheck runs cudacheck with args and env added to the environment
// and returns its output and exit code; a crash fails t.
func runCUDACheck(t testing.TB, bin string, env []string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.Output()
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("run cudacheck: %v", err)
		}
		if !ee.Exited() {
			t.Fatalf("cudacheck %s did not exit cleanly: %v\n%s%s", strings.Join(args, " "), ee, out, ee.Stderr)
		}
		return string(out), ee.ExitCode()
	}
	return string(out), 0
}

// spinLine is cudacheck --spin's result: launches, and multiply-adds of all
// threads per second.
var spinLine = regexp.MustCompile(`(?m)^cudacheck: spin (\d+) launches (\d+) it/s over `)

// spinRate returns the launches and the rate of cudacheck --spin's result
// line in out; ok is false without one.
func spinRate(out string) (launches uint64, rate float64, ok bool) {
	m := spinLine.FindStringSubmatch(out)
	if m == nil {
		return 0, 0, false
	}
	launches, err1 := strconv.ParseUint(m[1], 10, 64)
	rate, err2 := strconv.ParseFloat(m[2], 64)
	return launches, rate, err1 == nil && err2 == nil
}
