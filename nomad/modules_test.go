// The nomad module is a module of its own so that the core never pulls
// gRPC; it speaks Nomad's plugin protocol from its own .proto files and
// never links Nomad itself, whose module (github.com/hashicorp/nomad) is
// not under an open-source licence from 1.7 on. Only the MPL-licensed HTTP
// client, github.com/hashicorp/nomad/api, may be in any module's graph.
package nomad_test

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// allowed is the one module under github.com/hashicorp/nomad allowed.
const allowed = "github.com/hashicorp/nomad/api"

// nomadModules returns the modules under github.com/hashicorp/nomad other
// than the API client in the build list of the module in dir (go list -m
// all).
func nomadModules(t *testing.T, dir string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "list", "-m", "all")
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -m all in %s: %v\n%s", dir, err, stderr.Bytes())
	}
	var bad []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		path, _, _ := strings.Cut(sc.Text(), " ")
		if (path == "github.com/hashicorp/nomad" || strings.HasPrefix(path, "github.com/hashicorp/nomad/")) && path != allowed {
			bad = append(bad, sc.Text())
		}
	}
	return bad
}

// TestNoNomadModule: neither the core, nor the kubernetes module, nor this
// one has Nomad's own module in its build list.
func TestNoNomadModule(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command")
	}
	for _, dir := range []string{"..", "../kubernetes", "."} {
		t.Run(filepath.Base(mustAbs(t, dir)), func(t *testing.T) {
			if bad := nomadModules(t, dir); len(bad) > 0 {
				t.Fatalf("the module in %s has Nomad's module in its build list: %v", dir, bad)
			}
		})
	}
}

// TestNoNomadModuleSeen: the check sees Nomad's module where a build list
// has it (a module that requires it, replaced by an empty local copy).
func TestNoNomadModuleSeen(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command")
	}
	dir := t.TempDir()
	write := func(name, text string) {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/m\n\ngo 1.22\n\nrequire github.com/hashicorp/nomad v1.7.0\n\nreplace github.com/hashicorp/nomad => ./nomad\n")
	write("nomad/go.mod", "module github.com/hashicorp/nomad\n\ngo 1.22\n")
	if bad := nomadModules(t, dir); len(bad) != 1 || !strings.HasPrefix(bad[0], "github.com/hashicorp/nomad v1.7.0") {
		t.Fatalf("Nomad's module not seen: %v", bad)
	}
}

func mustAbs(t *testing.T, dir string) string {
	t.Helper()
	abs, err := filepath.Abs(dir)
	if err != nil {
		t.Fatal(err)
	}
	return abs
}
