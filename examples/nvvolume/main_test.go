package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
)

func TestUsageErrors(t *testing.T) {
	root := filepath.Join(t.TempDir(), "volumes")
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no command", nil, "no command"},
		{"flag first", []string{"--root", root}, "--root before the command"},
		{"unknown command", []string{"make", "--root", root}, `unknown command "make"`},
		{"bad flag", []string{"build", "--nope"}, "flag provided but not defined"},
		{"extra argument", []string{"list", "--root", root, "extra"}, "unexpected arguments"},
		{"bad capability", []string{"build", "--root", root, "--capabilities", "compute,magic"}, `capability "magic"`},
		{"bad version", []string{"build", "--root", root, "--driver-version", "../535"}, "invalid driver version"},
		{"relative root", []string{"build", "--root", "volumes"}, "not an absolute path"},
		{"gc keeps a path", []string{"gc", "--root", root, "--keep", "../x"}, "--keep"},
		{"relative driver root", []string{"build", "--root", root, "--driver-root", "run/nvidia/driver"}, "not an absolute path"},
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
			if _, err := os.Stat(root); !os.IsNotExist(err) {
				t.Fatalf("refused command created %s", root)
			}
		})
	}
}

func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"-h"}, {"build", "--help"}, {"gc", "-h"}} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := run(context.Background(), args, &stdout, &stderr); code != 0 {
				t.Fatalf("exit %d, want 0 (stderr %q)", code, stderr.String())
			}
			if !strings.HasPrefix(stdout.String(), "usage: nvvolume") || stderr.Len() != 0 {
				t.Fatalf("stdout %q, stderr %q; want the usage on stdout", stdout.String(), stderr.String())
			}
		})
	}
}

func TestMissingRootUntouched(t *testing.T) {
	root := filepath.Join(t.TempDir(), "missing")
	for _, args := range [][]string{{"list"}, {"gc"}} {
		t.Run(args[0], func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := run(context.Background(), append(args, "--root", root), &stdout, &stderr); code != 0 || stdout.Len() != 0 {
				t.Fatalf("exit %d, stdout %q, stderr %q; want 0 and nothing", code, stdout.String(), stderr.String())
			}
			if _, err := os.Stat(root); !os.IsNotExist(err) {
				t.Fatalf("nvvolume %s created %s", args[0], root)
			}
		})
	}
}

func TestBuildWrongVersion(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireNVIDIALibraries(t)
	root := filepath.Join(t.TempDir(), "volumes")
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"build", "--root", root, "--driver-version", "999.1.1"}, &stdout, &stderr)
	if code != 125 || !strings.Contains(stderr.String(), "does not match") && !strings.Contains(stderr.String(), "files found are of") {
		t.Fatalf("exit %d, stderr %q; want 125 and a version mismatch", code, stderr.String())
	}
	if _, err := os.Stat(filepath.Join(root, "nvidia_999.1.1")); !os.IsNotExist(err) {
		t.Fatalf("a volume 999.1.1 was built: %v", err)
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

// TestWaitEnds: while another process holds the root's lock, every command
// gives up at --wait in one line naming the holder, and a --wait that is
// not a positive duration is a usage error.
func TestWaitEnds(t *testing.T) {
	root := filepath.Join(t.TempDir(), "volumes")
	dir := filepath.Join(root, ".lock")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	f, err := linux.OpenLockFile(dir, "volumes.lock", os.Geteuid())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := linux.Lock(context.Background(), f); err != nil {
		t.Fatal(err)
	}
	linux.RecordHolder(f, "/proc")
	// The context's deadline only ends the test should --wait not hold.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, cmd := range []string{"list", "gc", "build"} {
		t.Run(cmd, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			args := []string{cmd, "--root", root, "--wait", "50ms"}
			if cmd == "build" {
				args = append(args, "--driver-version", "535.309.01")
			}
			code := run(ctx, args, &stdout, &stderr)
			want := fmt.Sprintf("held by pid %d (", os.Getpid())
			if code != 125 || !strings.Contains(stderr.String(), want) || strings.Count(stderr.String(), "\n") != 1 {
				t.Fatalf("exit %d, stderr %q; want 125 and one line with %q", code, stderr.String(), want)
			}
		})
	}
	for _, bad := range []string{"0s", "-1s", "soon"} {
		var stdout, stderr bytes.Buffer
		if code := run(ctx, []string{"list", "--root", root, "--wait", bad}, &stdout, &stderr); code != 125 || !strings.Contains(stderr.String(), "--wait") {
			t.Errorf("--wait %s: exit %d, stderr %q; want a usage error", bad, code, stderr.String())
		}
	}
}
