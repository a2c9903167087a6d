package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
)

// asMainEnv makes the test binary run gpuiso-runtime's main, so that tests
// can run the program (which replaces itself by runc) as a child.
const asMainEnv = "GPUISO_RUNTIME_AS_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(asMainEnv) == "1" {
		// Not for what it runs: a test's runc stand-in is this binary
		// again, told apart by its own variable.
		os.Unsetenv(asMainEnv)
		main()
	}
	if ctl := os.Getenv(stopRuncEnv); ctl != "" {
		os.Exit(stoppingRunc(ctl))
	}
	testenv.Main(m)
}

// runtimeCmd runs gpuiso-runtime with args in dir and returns its stdout,
// stderr and exit status.
func runtimeCmd(t *testing.T, dir string, args ...string) (string, string, int) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), asMainEnv+"=1")
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	code := 0
	if exit, ok := err.(*exec.ExitError); ok {
		code = exit.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errOut.String(), code
}

// fakeRunc writes a runc stand-in that records its arguments, one a line,
// in the returned file, and prints "fake runc".
func fakeRunc(t *testing.T) (path, calls string) {
	t.Helper()
	dir := t.TempDir()
	path, calls = filepath.Join(dir, "runc"), filepath.Join(dir, "calls")
	script := "#!/bin/sh\nprintf '%s\\n' \"$0\" \"$@\" > " + calls + "\necho fake runc\n"
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return path, calls
}

// bundle writes a bundle whose process has env, and returns its directory
// and config.json's bytes.
func bundle(t *testing.T, env ...string) (string, []byte) {
	t.Helper()
	dir := t.TempDir()
	spec := specs.Spec{Version: specs.Version, Root: &specs.Root{Path: "rootfs"}, Process: &specs.Process{Args: []string{"/probe"}, Env: env}, Linux: &specs.Linux{}}
	b, err := json.MarshalIndent(&spec, "", "\t")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir, b
}

// TestPassThrough: a container asking for nothing, and every command but
// create, reach runc with the same arguments less gpuiso-runtime's own
// flags, and the bundle is untouched.
func TestPassThrough(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  []string
		args []string
		want []string
	}{
		{name: "create without request", env: []string{"PATH=/bin"},
			args: []string{"--root", "/run/x", "--state-dir", "STATE", "create", "--bundle", "BUNDLE", "--pid-file", "/p", "c1"},
			want: []string{"--root", "/run/x", "create", "--bundle", "BUNDLE", "--pid-file", "/p", "c1"}},
		{name: "create void", env: []string{"NVIDIA_VISIBLE_DEVICES=void"},
			args: []string{"--simulate", "pcie8", "--dev-root", "DEVROOT", "create", "-b", "BUNDLE", "c2"},
			want: []string{"create", "-b", "BUNDLE", "c2"}},
		{name: "create empty", env: []string{"NVIDIA_VISIBLE_DEVICES="},
			args: []string{"create", "--bundle=BUNDLE", "c3"},
			want: []string{"create", "--bundle=BUNDLE", "c3"}},
		// No engine's record tells the caller's setting from the image's:
		// by default neither asks.
		{name: "create all, no record", env: []string{"NVIDIA_VISIBLE_DEVICES=all", "DOCKER_RESOURCE_GPU=0,1"},
			args: []string{"--state-dir", "STATE", "create", "--bundle", "BUNDLE", "c4"},
			want: []string{"create", "--bundle", "BUNDLE", "c4"}},
		{name: "create never", env: []string{"NVIDIA_VISIBLE_DEVICES=1"},
			args: []string{"--accept-env-request=never", "--timeout", "5s", "create", "--bundle", "BUNDLE", "c5"},
			want: []string{"create", "--bundle", "BUNDLE", "c5"}},
		{name: "state", args: []string{"--log", "/dev/null", "--log-format", "json", "state", "c1"},
			want: []string{"--log", "/dev/null", "--log-format", "json", "state", "c1"}},
		{name: "kill", args: []string{"--debug", "kill", "c1", "9"}, want: []string{"--debug", "kill", "c1", "9"}},
		{name: "exec", args: []string{"exec", "--process", "/p.json", "--detach", "c1"}, want: []string{"exec", "--process", "/p.json", "--detach", "c1"}},
		{name: "version", args: []string{"--version"}, want: []string{"--version"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runc, calls := fakeRunc(t)
			dir, before := bundle(t, tc.env...)
			state, devRoot := filepath.Join(t.TempDir(), "state"), filepath.Join(t.TempDir(), "sim")
			subst := strings.NewReplacer("BUNDLE", dir, "STATE", state, "DEVROOT", devRoot)
			args := []string{"--runc", runc}
			for _, a := range tc.args {
				args = append(args, subst.Replace(a))
			}
			out, errOut, code := runtimeCmd(t, dir, args...)
			if code != 0 || out != "fake runc\n" {
				t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errOut)
			}
			got, err := os.ReadFile(calls)
			if err != nil {
				t.Fatal(err)
			}
			var want []string
			for _, a := range append([]string{runc}, tc.want...) {
				want = append(want, subst.Replace(a))
			}
			if lines := strings.Split(strings.TrimSuffix(string(got), "\n"), "\n"); !slices.Equal(lines, want) {
				t.Errorf("runc got %q, want %q", lines, want)
			}
			after, err := os.ReadFile(filepath.Join(dir, "config.json"))
			if err != nil || !bytes.Equal(after, before) {
				t.Errorf("config.json changed: %v\n%s", err, after)
			}
			for _, p := range []string{state, devRoot} {
				if _, err := os.Stat(p); err == nil {
					t.Errorf("%s made for a container that asks for nothing", p)
				}
			}
		})
	}
}

// TestRefused: a request that cannot be read, or a bad command line, is one
// line on stderr (and an error in runc's log format), exit status 1, runc
// never called, the bundle untouched.
func TestRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{name: "empty entry", env: []string{"NVIDIA_VISIBLE_DEVICES=1,,2"}, args: []string{"create", "--bundle", "BUNDLE", "c1"}, want: "empty entry"},
		{name: "mig index", env: []string{"NVIDIA_VISIBLE_DEVICES=0:1"}, args: []string{"create", "--bundle", "BUNDLE", "c1"}, want: "MIG- UUID"},
		{name: "swarm all", env: []string{"DOCKER_RESOURCE_NVIDIA-GPU=all"}, args: []string{"run", "--bundle", "BUNDLE", "c1"}, want: "no Swarm assignment"},
		{name: "no id", env: []string{"NVIDIA_VISIBLE_DEVICES=1"}, args: []string{"create", "--bundle", "BUNDLE"}, want: "no container id"},
		{name: "no bundle", args: []string{"create", "--bundle", "BUNDLE/missing", "c1"}, want: "no such file"},
		{name: "simulate alone", args: []string{"--simulate", "pcie8", "create", "c1"}, want: "--dev-root"},
		{name: "flag without value", args: []string{"--state-dir"}, want: "needs a value"},
		{name: "unknown simulated node", env: []string{"NVIDIA_VISIBLE_DEVICES=1"}, args: []string{"--simulate", "nosuch", "--dev-root", "BUNDLE/sim", "create", "--bundle", "BUNDLE", "c1"}, want: "nosuch"},
		{name: "bad policy", args: []string{"--accept-env-request", "sometimes", "create", "--bundle", "BUNDLE", "c1"}, want: "--accept-env-request"},
		{name: "bad timeout", args: []string{"--timeout=0s", "create", "--bundle", "BUNDLE", "c1"}, want: "--timeout"},
		{name: "share without state dir", env: []string{"GPUISO_GPU_MEMORY=4GiB"}, args: []string{"create", "--bundle", "BUNDLE", "c1"}, want: "needs --state-dir"},
		{name: "swarm share without state dir", env: []string{"DOCKER_RESOURCE_VRAM=4000"}, args: []string{"create", "--bundle", "BUNDLE", "c1"}, want: "needs --state-dir"},
		{name: "bad share", env: []string{"DOCKER_RESOURCE_VRAM=4G"}, args: []string{"--state-dir", "BUNDLE/state", "create", "--bundle", "BUNDLE", "c1"}, want: "whole number of MiB"},
		{name: "memory without a unit", env: []string{"GPUISO_GPU_MEMORY=4096"}, args: []string{"--state-dir", "BUNDLE/state", "create", "--bundle", "BUNDLE", "c1"}, want: "without a unit: invalid GPU share request: give its unit, as GPUISO_GPU_MEMORY=4096MiB (or B, KiB, GiB, TiB; KB, MB, GB, TB)"},
		{name: "bad cdi flag", args: []string{"--accept-cdi-annotations", "maybe", "create", "--bundle", "BUNDLE", "c1"}, want: "--accept-cdi-annotations \"maybe\": want true or false"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runc, calls := fakeRunc(t)
			dir, before := bundle(t, tc.env...)
			logFile := filepath.Join(t.TempDir(), "log.json")
			// The bundle is the caller's own: its environment asks.
			args := []string{"--runc", runc, "--log", logFile, "--log-format", "json", "--accept-env-request", "always"}
			for _, a := range tc.args {
				args = append(args, strings.ReplaceAll(a, "BUNDLE", dir))
			}
			out, errOut, code := runtimeCmd(t, dir, args...)
			if code != 1 || out != "" {
				t.Fatalf("exit %d, stdout %q; want 1 and nothing", code, out)
			}
			if !strings.HasPrefix(errOut, "gpuiso-runtime: ") || strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, tc.want) {
				t.Errorf("stderr %q: want one line naming %q", errOut, tc.want)
			}
			if !endsWithRemedy(errOut) {
				t.Errorf("stderr %q: want it to end with what to do", errOut)
			}
			if _, err := os.Stat(calls); err == nil {
				t.Error("runc was called")
			}
			after, _ := os.ReadFile(filepath.Join(dir, "config.json"))
			if !bytes.Equal(after, before) {
				t.Errorf("config.json changed:\n%s", after)
			}
			if strings.HasPrefix(tc.args[0], "--") {
				return // a bad command line: the log is not yet known
			}
			b, err := os.ReadFile(logFile)
			if err != nil {
				t.Fatal(err)
			}
			var rec struct{ Level, Msg, Time string }
			if err := json.Unmarshal(b, &rec); err != nil || rec.Level != "error" || rec.Msg == "" || rec.Time == "" {
				t.Errorf("log %q: want one runc-style error record (%v)", b, err)
			}
			if !endsWithRemedy(rec.Msg) {
				t.Errorf("log record %q: want it to end with what to do", rec.Msg)
			}
		})
	}
}

// endsWithRemedy reports whether a refusal's line ends with what to do:
// a remedy of its error's kind, or one the error carries.
func endsWithRemedy(line string) bool {
	line = strings.TrimSuffix(line, "\n")
	if strings.HasSuffix(line, ": "+defaultRemedy) {
		return true
	}
	for _, r := range remedies {
		if strings.HasSuffix(line, ": "+r.do) {
			return true
		}
	}
	return strings.Contains(line[strings.LastIndex(line, ": ")+2:], "give its unit") || strings.HasSuffix(line, ": give --simulate one of the shipped topologies")
}
