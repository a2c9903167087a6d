package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// ProgramDirEnv names the environment variable that points the suites at a
// directory of prebuilt example programs (gpurun, agent, dockerrun, ...),
// so that test binaries built with go test -c run where there is no Go
// toolchain (the cgroup2-only VM, a GPU node).
const ProgramDirEnv = "GPUISO_PROGRAM_DIR"

// Program returns the path of the example program name, whose import path
// is pkg: the one in ProgramDirEnv's directory, else one named name next to
// the test binary, else one it compiles into a temporary directory of tb
// with the go command. Without a prebuilt one or a go command it skips tb
// (a required suite then fails).
func Program(tb testing.TB, suite Suite, name, pkg string) string {
	tb.Helper()
	if dir := os.Getenv(ProgramDirEnv); dir != "" {
		p := filepath.Join(dir, name)
		if err := executable(p); err != nil {
			tb.Fatalf("%s=%s: %v", ProgramDirEnv, dir, err)
		}
		return p
	}
	if exe, err := os.Executable(); err == nil {
		if p := filepath.Join(filepath.Dir(exe), name); executable(p) == nil {
			return p
		}
	}
	if _, err := exec.LookPath("go"); err != nil {
		skip(tb, suite, "no prebuilt %s (set %s) and no go command to build it: %v", name, ProgramDirEnv, err)
	}
	out := filepath.Join(tb.TempDir(), name)
	if b, err := exec.Command("go", "build", "-buildvcs=false", "-o", out, pkg).CombinedOutput(); err != nil {
		tb.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
	return out
}
