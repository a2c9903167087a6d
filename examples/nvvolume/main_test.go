package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/internal/testenv"
)

func TestUsageErrors(t *testing.T) {
	root := filepath.Join(t.TempDir(), "volumes")
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no command", nil, "usage: nvvolume"},
		{"flag first", []string{"--root", root}, "usage: nvvolume"},
		{"unknown command", []string{"make", "--root", root}, `unknown command "make"`},
		{"bad flag", []string{"build", "--nope"}, "flag provided but not defined"},
		{"extra argument", []string{"list", "--root", root, "extra"}, "unexpected arguments"},
		{"bad capability", []string{"build", "--root", root, "--capabilities", "compute,magic"}, `capability "magic"`},
		{"bad version", []string{"build", "--root", root, "--driver-version", "../535"}, "invalid driver version"},
		{"relative root", []string{"build", "--root", "volumes"}, "not an absolute path"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := run(context.Background(), tt.args, &stdout, &stderr); code != 2 {
				t.Fatalf("exit %d, want 2 (stderr %q)", code, stderr.String())
			}
			if !strings.Contains(stderr.String(), tt.want) {
				t.Fatalf("stderr %q, want %q", stderr.String(), tt.want)
			}
			if _, err := os.Stat(root); !os.IsNotExist(err) {
				t.Fatalf("refused command created %s", root)
			}
		})
	}
}

func TestBuildListGC(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireNVIDIALibraries(t)
	root := filepath.Join(t.TempDir(), "volumes")
	ctx := context.Background()
	do := func(want int, args ...string) string {
		t.Helper()
		var stdout, stderr bytes.Buffer
		if code := run(ctx, append(args, "--root", root), &stdout, &stderr); code != want {
			t.Fatalf("nvvolume %q: exit %d, want %d; stderr %q", args, code, want, stderr.String())
		}
		return stdout.String()
	}
	out := do(0, "build")
	line := regexp.MustCompile(`^(\S+/nvidia_([0-9.]+))\t([0-9.]+)\t([0-9]+) files\t[0-9]+ links\tbuilt\n$`)
	m := line.FindStringSubmatch(out)
	if m == nil || m[2] != m[3] {
		t.Fatalf("build printed %q", out)
	}
	if _, err := os.Stat(filepath.Join(m[1], "bin", "nvidia-smi")); err != nil {
		t.Fatal(err)
	}
	if out := do(0, "build", "--capabilities", "utility,compute"); !strings.HasSuffix(out, "\tfound\n") {
		t.Fatalf("second build printed %q, want the volume found", out)
	}
	if out, want := do(0, "list"), m[1]+"\t"+m[2]+"\t"+m[4]+" files\tusers -\n"; out != want {
		t.Fatalf("list printed %q, want %q", out, want)
	}
	if out := do(0, "gc", "--keep", m[2]); out != "" {
		t.Fatalf("gc keeping the version printed %q", out)
	}
	if out := do(0, "gc"); out != "removed "+m[2]+"\n" {
		t.Fatalf("gc printed %q", out)
	}
	if out := do(0, "list"); out != "" {
		t.Fatalf("list after gc printed %q", out)
	}
}
