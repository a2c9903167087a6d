package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/isolator/cdi"
)

func TestUsageErrors(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "cdi")
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no command", nil, "no command"},
		{"flag first", []string{"--dir", dir}, "--dir before the command"},
		{"unknown command", []string{"make"}, `unknown command "make"`},
		{"bad flag", []string{"generate", "--nope"}, "flag provided but not defined"},
		{"flag of another command", []string{"list", "--kind", "a.com/b"}, "flag provided but not defined"},
		{"bad kind", []string{"generate", "--dir", dir, "--kind", "nvidia"}, "--kind"},
		{"relative dir", []string{"generate", "--dir", "cdi"}, "not an absolute path"},
		{"sim root without simulate", []string{"generate", "--dir", dir, "--sim-root", "/tmp/x"}, "--simulate only"},
		{"the old --dev-root and --sim-root", []string{"generate", "--dir", dir, "--simulate", "pcie8", "--dev-root", "/tmp/x", "--sim-root", "/tmp/x"}, "give --sim-root once"},
		{"the old --dev-root without simulate", []string{"generate", "--dir", dir, "--dev-root", "/tmp/x"}, "--simulate only"},
		{"unknown topology", []string{"generate", "--dir", dir, "--simulate", "dgx9"}, "dgx9"},
		{"relative volume", []string{"generate", "--dir", dir, "--volume", "vol"}, "not an absolute path"},
		{"extra argument", []string{"generate", "--dir", dir, "extra"}, "unexpected arguments"},
		{"validate nothing", []string{"validate"}, "want one spec file"},
		{"validate missing", []string{"validate", filepath.Join(dir, "x.json")}, "no such file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := run(context.Background(), tt.args, &stdout, &stderr); code != 125 {
				t.Fatalf("exit %d, want 125 (stderr %q)", code, stderr.String())
			}
			if !strings.Contains(stderr.String(), tt.want) {
				t.Fatalf("stderr %q, want %q", stderr.String(), tt.want)
			}
			if n := strings.Count(stderr.String(), "\n"); n != 1 || stdout.Len() != 0 {
				t.Fatalf("printed %d lines to stderr, %q to stdout; want one line, nothing", n, stdout.String())
			}
			if _, err := os.Stat(dir); !os.IsNotExist(err) {
				t.Fatalf("refused command created %s", dir)
			}
		})
	}
}

func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"-h"}, {"generate", "--help"}, {"list", "-h"}} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := run(context.Background(), args, &stdout, &stderr); code != 0 {
				t.Fatalf("exit %d, want 0 (stderr %q)", code, stderr.String())
			}
			if !strings.HasPrefix(stdout.String(), "usage: nvcdi") || stderr.Len() != 0 {
				t.Fatalf("stdout %q, stderr %q; want the usage on stdout", stdout.String(), stderr.String())
			}
		})
	}
}

// TestGenerate writes the spec of a simulated node, validates and lists it,
// and runs generate again: the file is left as it was.
func TestGenerate(t *testing.T) {
	testenv.RequireRoot(t)
	tmp := t.TempDir()
	dir, devRoot := filepath.Join(tmp, "cdi"), filepath.Join(tmp, "node")
	args := []string{"generate", "--simulate", "dgx1-volta", "--sim-root", devRoot, "--dir", dir}
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), args, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	names := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	if len(names) != 17 || names[0] != "nvidia.com/gpu=0" || names[16] != "nvidia.com/gpu=all" {
		t.Fatalf("names %q", names)
	}
	path := filepath.Join(dir, "nvidia.com-gpu.json")
	spec, err := cdi.ValidateFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range spec.Devices[:1] {
		hp := d.ContainerEdits.DeviceNodes[0].HostPath
		if !strings.HasPrefix(hp, filepath.Join(devRoot, "dev")+"/") {
			t.Errorf("device node %s not under --sim-root", hp)
		}
		if _, err := os.Stat(hp); err != nil {
			t.Errorf("device node: %v", err)
		}
	}

	past := time.Now().Add(-time.Hour).Truncate(time.Second)
	os.Chtimes(path, past, past)
	before, _ := os.ReadFile(path)
	stdout.Reset()
	stderr.Reset()
	if code := run(context.Background(), args, &stdout, &stderr); code != 0 {
		t.Fatalf("second run: exit %d: %s", code, stderr.String())
	}
	after, _ := os.ReadFile(path)
	fi, _ := os.Stat(path)
	if !bytes.Equal(before, after) || !fi.ModTime().Equal(past) || !strings.Contains(stderr.String(), "unchanged") {
		t.Errorf("second run touched the spec (mtime %v, stderr %q)", fi.ModTime(), stderr.String())
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"validate", path}, "valid, cdiVersion 0.5.0, kind nvidia.com/gpu, 17 devices"},
		{[]string{"list", "--dir", dir}, "nvidia.com/gpu=7"},
	} {
		stdout.Reset()
		if code := run(context.Background(), tc.args, &stdout, &stderr); code != 0 || !strings.Contains(stdout.String(), tc.want) {
			t.Errorf("%v: exit %d, %q; want %q", tc.args, code, stdout.String(), tc.want)
		}
	}

	// A bad spec beside the good one: list still lists, and says which file.
	os.WriteFile(filepath.Join(dir, "bad.json"), []byte("{"), 0o644)
	stdout.Reset()
	stderr.Reset()
	code := run(context.Background(), []string{"list", "--dir", dir}, &stdout, &stderr)
	if code != 125 || !strings.Contains(stdout.String(), "nvidia.com/gpu=all") || !strings.Contains(stderr.String(), "bad.json") {
		t.Errorf("list with a bad spec: exit %d, stdout %q, stderr %q", code, stdout.String(), stderr.String())
	}
}
