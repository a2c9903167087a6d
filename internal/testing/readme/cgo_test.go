package readme

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// cgoFlags reads the CGO_CFLAGS an entry point sets.
func cgoFlags(t *testing.T, file string, re *regexp.Regexp) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, file))
	if err != nil {
		t.Fatal(err)
	}
	m := re.FindSubmatch(b)
	if m == nil {
		t.Fatalf("%s sets no CGO_CFLAGS (want %s)", file, re)
	}
	return string(m[1])
}

// TestCgoFlags: the Makefile and .ci/env.sh (which every script sources)
// set the same CGO_CFLAGS unconditionally, so they share one build cache;
// with those flags a cold build of go-nvml prints no warning, and without
// them it does (the test would notice if the flags stopped working).
func TestCgoFlags(t *testing.T) {
	mk := cgoFlags(t, "Makefile", regexp.MustCompile(`(?m)^export CGO_CFLAGS := (.+)$`))
	sh := cgoFlags(t, ".ci/env.sh", regexp.MustCompile(`(?m)^export CGO_CFLAGS='([^']+)'$`))
	if mk != sh {
		t.Fatalf("Makefile sets CGO_CFLAGS %q, .ci/env.sh %q: want one value", mk, sh)
	}
	for _, script := range []string{".ci/demo.sh", ".ci/test.sh", ".ci/probe-image.sh"} {
		b, err := os.ReadFile(filepath.Join(root, script))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), "source .ci/env.sh") {
			t.Errorf("%s does not source .ci/env.sh", script)
		}
	}
	if testing.Short() {
		t.Skip("a cold build of go-nvml takes tens of seconds")
	}
	if _, err := exec.LookPath("go"); err != nil {
		t.Skipf("no go command: %v", err)
	}
	build := func(flags string) string {
		cmd := exec.Command("go", "build", "github.com/NVIDIA/go-nvml/pkg/nvml")
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "GOCACHE="+t.TempDir(), "CGO_ENABLED=1", "CGO_CFLAGS="+flags)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("go build go-nvml with CGO_CFLAGS=%q: %v\n%s", flags, err, out)
		}
		return string(out)
	}
	if out := build(mk); compilerWarning.MatchString(out) {
		t.Errorf("with CGO_CFLAGS=%q go-nvml's build warns:\n%s", mk, out)
	}
	if out := build("-O2 -g"); !compilerWarning.MatchString(out) {
		t.Errorf("without -Wno-deprecated-declarations go-nvml's build does not warn: the test proves nothing")
	}
}
