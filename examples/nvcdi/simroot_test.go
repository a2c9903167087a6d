package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
)

// TestOldDevRoot: --dev-root, --sim-root's old spelling, is read as it
// with one line saying so; the tree is the one --sim-root then finds.
func TestOldDevRoot(t *testing.T) {
	testenv.RequireRoot(t)
	tmp := t.TempDir()
	root := filepath.Join(tmp, "node")
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"generate", "--simulate", "pcie8", "--dev-root", root, "--dir", filepath.Join(tmp, "a")}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	if !strings.HasPrefix(stderr.String(), "nvcdi generate: --dev-root is the old spelling of --sim-root") {
		t.Errorf("stderr %q: no line about the old spelling", stderr.String())
	}
	old := stdout.String()
	stdout.Reset()
	stderr.Reset()
	if code := run(context.Background(), []string{"generate", "--simulate", "pcie8", "--sim-root", root, "--dir", filepath.Join(tmp, "b")}, &stdout, &stderr); code != 0 || stdout.String() != old {
		t.Fatalf("--sim-root of the same tree: exit %d, %q, stdout %q, want %q", code, stderr.String(), stdout.String(), old)
	}
	a, _ := os.ReadFile(filepath.Join(tmp, "a", "nvidia.com-gpu.json"))
	b, _ := os.ReadFile(filepath.Join(tmp, "b", "nvidia.com-gpu.json"))
	if len(a) == 0 || !bytes.Equal(a, b) {
		t.Error("the specs written through --dev-root and --sim-root differ")
	}
}

// TestSimRootUntrusted: a --sim-root another user made is refused in one
// line naming it, and nothing is made in it.
func TestSimRootUntrusted(t *testing.T) {
	testenv.RequireRoot(t)
	tmp := t.TempDir()
	theirs := filepath.Join(tmp, "theirs")
	if err := os.Mkdir(theirs, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(theirs, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"generate", "--simulate", "pcie8", "--sim-root", theirs, "--dir", filepath.Join(tmp, "cdi")}, &stdout, &stderr)
	if msg := stderr.String(); code != 125 || strings.Count(msg, "\n") != 1 || !strings.HasPrefix(msg, "nvcdi generate: ") || !strings.Contains(msg, "owned by uid 65534") {
		t.Errorf("exit %d, stderr %q; want 125 and one line refusing it", code, msg)
	}
	if left, _ := os.ReadDir(theirs); len(left) != 0 {
		t.Errorf("made %s in it", left[0].Name())
	}
}
