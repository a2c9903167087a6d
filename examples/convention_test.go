// Package examples holds the test that the example programs (gpuiso-runtime,
// which speaks the OCI runtime CLI, is in cmd/ and not one of them) follow one
// command-line convention (internal/cli): help on stdout with a usage line,
// docker run's exit status 125 for their own errors (usage errors included),
// flags spelt --name, and per-subcommand help.
package examples

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
)

var programs = []string{"agent", "allocsim", "dockerrun", "gpuinfo", "gpurun", "nvcdi", "nvvolume"}

// build compiles the programs into one directory.
func build(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skipf("no go command to build the programs: %v", err)
	}
	dir := t.TempDir()
	var pkgs []string
	for _, p := range programs {
		pkgs = append(pkgs, "./"+p)
	}
	cmd := exec.Command("go", append([]string{"build", "-buildvcs=false", "-o", dir + string(filepath.Separator)}, pkgs...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return dir
}

func runProgram(t *testing.T, dir, prog string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(filepath.Join(dir, prog), args...)
	cmd.Env = append(os.Environ(), "DOCKER_HOST=unix:///nonexistent/docker.sock")
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatalf("%s %q: %v", prog, args, err)
	}
	return out.String(), errOut.String(), code
}

// singleDash matches a flag printed the flag package's way ("  -gpus").
var singleDash = regexp.MustCompile(`(?m)^\s+-[a-z]`)

func TestConvention(t *testing.T) {
	dir := build(t)
	type tc struct {
		prog string
		args []string
	}
	help := []tc{
		{"agent", nil}, {"allocsim", nil}, {"dockerrun", nil}, {"dockerrun", []string{"gc"}}, {"gpuinfo", nil}, {"gpurun", nil},
		{"nvcdi", nil}, {"nvcdi", []string{"generate"}}, {"nvcdi", []string{"list"}}, {"nvcdi", []string{"validate"}},
		{"nvvolume", nil}, {"nvvolume", []string{"build"}}, {"nvvolume", []string{"list"}}, {"nvvolume", []string{"gc"}},
	}
	for _, h := range help {
		for _, flag := range []string{"--help", "-h"} {
			name := strings.Join(append([]string{h.prog}, h.args...), " ")
			t.Run("help/"+name+" "+flag, func(t *testing.T) {
				out, errOut, code := runProgram(t, dir, h.prog, append(h.args, flag)...)
				if code != 0 || errOut != "" {
					t.Fatalf("exit %d, stderr %q: want 0 and nothing on stderr", code, errOut)
				}
				if !strings.HasPrefix(out, "usage: "+name) {
					t.Fatalf("stdout does not start with %q:\n%s", "usage: "+name, out)
				}
				if singleDash.MatchString(out) {
					t.Fatalf("a flag printed with one dash:\n%s", out)
				}
			})
		}
	}

	// Per-subcommand help lists only that subcommand's flags.
	t.Run("subcommand flags", func(t *testing.T) {
		for _, c := range []struct {
			args       []string
			has, hasNt string
		}{
			{[]string{"nvvolume", "build", "--help"}, "--driver-root", "--keep"},
			{[]string{"nvvolume", "gc", "--help"}, "--keep", "--driver-root"},
			{[]string{"nvvolume", "list", "--help"}, "--root", "--capabilities"},
			{[]string{"nvcdi", "list", "--help"}, "--dir", "--simulate"},
			{[]string{"dockerrun", "gc", "--help"}, "--state-dir", "--gpus"},
		} {
			out, _, _ := runProgram(t, dir, c.args[0], c.args[1:]...)
			if !strings.Contains(out, c.has) || strings.Contains(out, c.hasNt) {
				t.Errorf("%q: want %s and no %s in\n%s", c.args, c.has, c.hasNt, out)
			}
		}
	})

	// Usage errors: 125, one line on stderr naming the program, nothing on
	// stdout, flags spelt --name.
	usage := []tc{
		{"agent", []string{"--bogus"}}, {"agent", []string{"--gpus", "2"}},
		{"allocsim", []string{"--bogus"}}, {"allocsim", []string{"extra"}},
		{"dockerrun", []string{"--bogus", "img"}}, {"dockerrun", nil}, {"dockerrun", []string{"gc", "extra"}},
		{"dockerrun", []string{"--gpus", "2", "--devices", "1", "img"}},
		{"gpuinfo", []string{"--bogus"}}, {"gpuinfo", []string{"extra"}}, {"gpuinfo", []string{"--driver-version", "1.2"}},
		{"gpurun", []string{"--bogus", "--", "true"}}, {"gpurun", nil}, {"gpurun", []string{"--label", "a=b", "--", "true"}},
		{"gpurun", []string{"--gpus", "2", "--devices", "1", "--", "true"}},
		{"nvcdi", nil}, {"nvcdi", []string{"bogus"}}, {"nvcdi", []string{"list", "--simulate", "x"}},
		{"nvcdi", []string{"list", "--dir", "/nonexistent/cdi"}}, {"nvcdi", []string{"validate"}},
		{"nvvolume", nil}, {"nvvolume", []string{"list", "--keep", "1"}}, {"nvvolume", []string{"build", "extra"}},
		{"nvvolume", []string{"build", "--driver-root", "/nonexistent/driver"}},
	}
	for _, u := range usage {
		t.Run("error/"+u.prog+" "+strings.Join(u.args, " "), func(t *testing.T) {
			out, errOut, code := runProgram(t, dir, u.prog, u.args...)
			if code != 125 || out != "" || strings.Count(errOut, "\n") != 1 || !strings.HasPrefix(errOut, u.prog+" ") && !strings.HasPrefix(errOut, u.prog+":") {
				t.Fatalf("exit %d, stdout %q, stderr %q: want 125, nothing on stdout, one line from %s", code, out, errOut, u.prog)
			}
			if strings.Contains(errOut, " -bogus") || strings.Contains(errOut, "flag -") {
				t.Fatalf("a flag named with one dash: %q", errOut)
			}
		})
	}
}

// TestSignalStatus: a run that SIGTERM or SIGINT ends exits 128+n, as
// docker run does, after its container is gone.
func TestSignalStatus(t *testing.T) {
	testenv.RequireRoot(t)
	dir := build(t)
	for _, tc := range []struct {
		sig  syscall.Signal
		want int
	}{{syscall.SIGTERM, 143}, {syscall.SIGINT, 130}} {
		t.Run(tc.sig.String(), func(t *testing.T) {
			cmd := exec.Command(filepath.Join(dir, "gpurun"), "--simulate", "pcie8", "--", "sleep", "60")
			stderr, err := cmd.StderrPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			// The container runs once gpurun says which GPUs it got.
			sc := bufio.NewScanner(stderr)
			var seen []string
			for sc.Scan() {
				seen = append(seen, sc.Text())
				if strings.HasPrefix(sc.Text(), "gpurun: GPUs") {
					break
				}
			}
			if err := cmd.Process.Signal(tc.sig); err != nil {
				t.Fatal(err)
			}
			go io.Copy(io.Discard, stderr)
			err = cmd.Wait()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != tc.want {
				t.Fatalf("gpurun after %v: %v, want exit %d; stderr %q", tc.sig, err, tc.want, seen)
			}
		})
	}
}
