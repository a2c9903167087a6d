package testenv

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// leakyEnv selects what TestLeakyChild leaks in a child of TestCheckLeaks.
const leakyEnv = "GPUISO_TESTENV_LEAK"

// leakyFileEnv names the file TestLeakyChild leaves open.
const leakyFileEnv = "GPUISO_TESTENV_LEAK_FILE"

// leakyMain runs a child of TestCheckLeaks under checkLeaks, with a short
// settle time.
func leakyMain(m *testing.M) int {
	return checkLeaks(m.Run, os.Stderr, settleFor(300*time.Millisecond))
}

// TestLeakyChild leaks what leakyEnv names; it runs only in a child of
// TestCheckLeaks.
func TestLeakyChild(t *testing.T) {
	switch os.Getenv(leakyEnv) {
	case "":
		t.Skip("runs only in a child of TestCheckLeaks")
	case "fd":
		// A raw descriptor: an *os.File left behind could be closed by its
		// finalizer.
		if _, err := syscall.Open(os.Getenv(leakyFileEnv), syscall.O_RDONLY|syscall.O_CLOEXEC, 0); err != nil {
			t.Fatal(err)
		}
	case "goroutine":
		go leakedGoroutine(make(chan struct{}))
	case "process":
		if err := exec.Command("sleep", "61").Start(); err != nil {
			t.Fatal(err)
		}
	case "closed":
		// What a test opens, starts and waits for, it ends: no leak.
		f, err := os.Open(os.Getenv(leakyFileEnv))
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
		done := make(chan struct{})
		go func() { <-done }()
		close(done)
		if err := exec.Command("true").Run(); err != nil {
			t.Fatal(err)
		}
	}
}

func leakedGoroutine(never chan struct{}) { <-never }

// TestCheckLeaks runs TestLeakyChild in a child test binary under
// CheckLeaks, leaking one thing at a time: the run fails and names what
// leaked; a run that leaks nothing passes.
func TestCheckLeaks(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "leaked-file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		leak string
		want *regexp.Regexp // nil: the run passes
	}{
		{"fd", regexp.MustCompile(`file descriptor \d+ open: ` + regexp.QuoteMeta(file))},
		{"goroutine", regexp.MustCompile(`goroutine running:\n(.|\n)*testenv\.leakedGoroutine`)},
		{"process", regexp.MustCompile(`child process \d+ \(sleep, state S\) running: sleep 61`)},
		{"closed", nil},
	}
	for _, tt := range tests {
		t.Run(tt.leak, func(t *testing.T) {
			cmd := exec.Command(exe, "-test.run=^TestLeakyChild$", "-test.count=1")
			cmd.Env = append(os.Environ(), leakyEnv+"="+tt.leak, leakyFileEnv+"="+file)
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if err != nil && !errors.As(err, &exit) {
				t.Fatal(err)
			}
			if tt.want == nil {
				if err != nil || strings.Contains(string(out), "leaked") {
					t.Fatalf("a run that leaks nothing: %v\n%s", err, out)
				}
				return
			}
			if err == nil || !tt.want.Match(out) || !strings.Contains(string(out), "FAIL: leaks") {
				t.Fatalf("a run leaking a %s: %v; want a failure matching %q:\n%s", tt.leak, err, tt.want, out)
			}
			t.Logf("%s", out)
		})
	}
}
