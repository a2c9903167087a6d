package readme

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestGoCheck: .ci/gocheck.sh, which every entry point runs first, passes
// with a Go that meets go.mod and stops an older or missing one with one
// line naming the version needed.
func TestGoCheck(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skipf("no bash: %v", err)
	}
	real, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command: %v", err)
	}
	old := t.TempDir()
	fake := "#!/bin/sh\nif [ \"$1\" = env ]; then echo go1.19.8; else echo 'go version go1.19.8 linux/amd64'; fi\n"
	if err := os.WriteFile(filepath.Join(old, "go"), []byte(fake), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, path string
		ok         bool
		want       string
	}{
		{"current", filepath.Dir(real) + ":/usr/bin:/bin", true, ""},
		{"too old", old + ":/usr/bin:/bin", false, "is go1.19.8"},
		{"missing", t.TempDir() + ":/usr/bin:/bin", false, "finds no go command"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "missing" {
				if _, err := os.Stat("/usr/bin/go"); err == nil {
					t.Skip("/usr/bin/go exists")
				}
			}
			cmd := exec.Command("bash", ".ci/gocheck.sh")
			cmd.Dir = root
			cmd.Env = append(os.Environ(), "PATH="+tc.path)
			out, err := cmd.CombinedOutput()
			if (err == nil) != tc.ok {
				t.Fatalf("gocheck: %v, want ok %v; output %q", err, tc.ok, out)
			}
			if tc.ok {
				return
			}
			if strings.Count(string(out), "\n") != 1 || !strings.Contains(string(out), "gpuiso needs Go ") || !strings.Contains(string(out), tc.want) {
				t.Fatalf("gocheck said %q, want one line with %q", out, tc.want)
			}
		})
	}
}
