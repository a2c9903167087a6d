package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

func TestRequired(t *testing.T) {
	tests := []struct {
		name  string
		env   string
		suite Suite
		want  bool
	}{
		{"unset", "", Root, false},
		{"listed", "docker,root", Root, true},
		{"spaces", " docker , cgroup2 ", CgroupV2, true},
		{"not listed", "docker", CgroupV1Devices, false},
		{"all", "all", NVIDIALibraries, true},
		{"all holds podman", "all", Podman, true},
		{"all holds kubernetes", "all", Kubernetes, true},
		{"all holds runc", "all", Runc, true},
		{"all holds helm", "all", Helm, true},
		{"all leaves hardware out", "all", GPU, false},
		{"hardware by name", "all,gpu", GPU, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(RequireEnv, tt.env)
			if got := Required(tt.suite); got != tt.want {
				t.Fatalf("Required(%q) with %s=%q = %v, want %v", tt.suite, RequireEnv, tt.env, got, tt.want)
			}
		})
	}
}

// TestRequireRunc: without runc on PATH the gate skips, or fails when the
// suite is required; with it, it returns the binary's path.
func TestRequireRunc(t *testing.T) {
	if _, err := exec.LookPath("runc"); err == nil {
		if got := RequireRunc(t); !filepath.IsAbs(got) {
			t.Errorf("RequireRunc = %q, want an absolute path", got)
		}
	}
	tests := []struct {
		name     string
		env      string
		wantFail bool
	}{
		{"not required", "", false},
		{"required by name", "runc", true},
		{"required by all", "all", true},
		{"another suite", "docker", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("PATH", t.TempDir())
			t.Setenv(RequireEnv, tt.env)
			rec := &recorder{TB: t}
			done := make(chan struct{})
			go func() {
				defer close(done)
				RequireRunc(rec)
			}()
			<-done
			if rec.failed != tt.wantFail || rec.skipped == tt.wantFail {
				t.Fatalf("with %s=%q and no runc: failed %v, skipped %v; want failed %v (%s)", RequireEnv, tt.env, rec.failed, rec.skipped, tt.wantFail, rec.msg)
			}
			if !strings.Contains(rec.msg, "no runc on PATH") {
				t.Errorf("message %q does not say runc is missing", rec.msg)
			}
		})
	}
}

// recorder is a testing.TB whose Fatalf and Skipf record what they were
// asked and end the calling goroutine, as the real ones do.
type recorder struct {
	testing.TB
	failed, skipped bool
	msg             string
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) {
	r.failed, r.msg = true, fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (r *recorder) Skipf(format string, args ...any) {
	r.skipped, r.msg = true, fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// TestRequireHelm: with HelmEnv naming no file the gate skips, or fails
// when the suite is required; naming one, it returns it.
func TestRequireHelm(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(HelmEnv, exe)
	if got := RequireHelm(t); got != exe {
		t.Errorf("RequireHelm with %s=%s = %q", HelmEnv, exe, got)
	}
	for _, tt := range []struct {
		env      string
		wantFail bool
	}{{"", false}, {"helm", true}, {"all", true}, {"kubernetes", false}} {
		t.Run(tt.env, func(t *testing.T) {
			t.Setenv(HelmEnv, filepath.Join(t.TempDir(), "helm"))
			t.Setenv(RequireEnv, tt.env)
			rec := &recorder{TB: t}
			done := make(chan struct{})
			go func() {
				defer close(done)
				RequireHelm(rec)
			}()
			<-done
			if rec.failed != tt.wantFail || rec.skipped == tt.wantFail || !strings.Contains(rec.msg, "no helm at") {
				t.Fatalf("with %s=%q and no helm: failed %v, skipped %v; want failed %v (%s)", RequireEnv, tt.env, rec.failed, rec.skipped, tt.wantFail, rec.msg)
			}
		})
	}
}
