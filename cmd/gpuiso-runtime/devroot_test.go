package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestDevRootRefusesUserDir runs the built gpuiso-runtime: a create whose
// --dev-root holds a user's files (beside the tree and in its dev), or is
// the host's own root directory, is refused with one line naming the
// directory, and every file of the user's stays. The refusal comes before
// anything is made, so no root is needed.
func TestDevRootRefusesUserDir(t *testing.T) {
	bin := buildRuntime(t)
	bundle := t.TempDir()
	config := `{"ociVersion": "1.0.2", "process": {"args": ["true"], "cwd": "/"}, "root": {"path": "rootfs"},
		"annotations": {"cdi.k8s.io/gpuiso": "nvidia.com/gpu=0"}}`
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	files := map[string]string{"notes.txt": "mine\n", "dev/keep": "mine too\n"}
	for p, body := range files {
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, root := range []string{dir, "/"} {
		var stderr bytes.Buffer
		cmd := exec.Command(bin, "--simulate", "dgx1-volta", "--dev-root", root, "--runc", "/bin/false", "--accept-cdi-annotations", "true",
			"create", "--bundle", bundle, "gpuiso-devroot-test")
		cmd.Stderr = &stderr
		err := cmd.Run()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != exitRefused {
			t.Errorf("--dev-root %s: %v, want exit %d\n%s", root, err, exitRefused, stderr.String())
		}
		msg := strings.TrimSuffix(stderr.String(), "\n")
		if strings.Contains(msg, "\n") || !strings.HasPrefix(msg, "gpuiso-runtime: ") || !strings.Contains(msg, root+" ") {
			t.Errorf("--dev-root %s: want one line naming it, got:\n%s", root, stderr.String())
		}
		if root == dir && !strings.Contains(msg, "not made by gpuiso") {
			t.Errorf("--dev-root %s: the line does not say why: %s", root, msg)
		}
	}
	for p, body := range files {
		if b, err := os.ReadFile(filepath.Join(dir, p)); err != nil || string(b) != body {
			t.Errorf("the user's %s: %q, %v; want %q", p, b, err, body)
		}
	}
	if list, _ := os.ReadDir(dir); len(list) != 2 {
		t.Errorf("--dev-root %s holds %d entries, want the user's 2", dir, len(list))
	}
	if _, err := os.Stat("/.gpuiso-simulated-host"); err == nil {
		t.Error("the host's root directory was marked as a simulated host")
	}
}
