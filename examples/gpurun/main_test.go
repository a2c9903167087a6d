package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/containerizer/native"
	"github.com/gpuiso/gpuiso/internal/testenv"
)

func TestMain(m *testing.M) {
	native.Init() // this test binary is the containers' init
	if os.Getenv(asGpurunEnv) != "" {
		main() // a gpurun process of the multi-process tests
	}
	os.Exit(m.Run())
}

func gpurun(args ...string) (stdout, stderr string, code int) {
	var out, errOut testenv.Buffer
	code = run(context.Background(), args, strings.NewReader(""), &out, &errOut)
	return out.String(), errOut.String(), code
}

// TestSimulated runs a command on GPUs 1 and 3 of a simulated DGX-1, for
// each cgroup version: it sees exactly its GPU nodes, and gpurun exits with
// its status after one line saying what it got.
func TestSimulated(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCgroupV1Devices(t)
	testenv.RequireCgroupV2(t)
	for _, v := range []string{"v1", "v2"} {
		t.Run(v, func(t *testing.T) {
			out, errOut, code := gpurun("--simulate", "dgx1-volta", "--devices", "1,3", "--cgroup", v, "--",
				"/bin/sh", "-c", `ls /dev | grep '^nvidia[0-9]'; echo "$NVIDIA_VISIBLE_DEVICES"; exit 7`)
			if code != 7 {
				t.Fatalf("exit %d, want the command's 7\nstdout: %s\nstderr: %s", code, out, errOut)
			}
			lines := strings.Split(strings.TrimSpace(out), "\n")
			if len(lines) != 3 || lines[0] != "nvidia1" || lines[1] != "nvidia3" || strings.Count(lines[2], "GPU-") != 2 {
				t.Fatalf("the command saw %q", lines)
			}
			info := strings.Split(strings.TrimSpace(errOut), "\n")
			if len(info) != 1 || !strings.HasPrefix(info[0], "gpurun: GPUs 1,3 (") || !strings.Contains(info[0], "simulated dgx1-volta") {
				t.Fatalf("stderr = %q, want one line naming GPUs 1,3 (stdout %q)", errOut, out)
			}
			if _, _, code := gpurun("--simulate", "pcie8", "--gpus", "2", "--quiet", "--cgroup", v, "--", "/bin/true"); code != 0 {
				t.Fatalf("--quiet run exited %d", code)
			}
		})
	}
}

// TestNoDriver: on this host's real node (no kernel driver) gpurun says so
// in one line and exits non-zero.
func TestNoDriver(t *testing.T) {
	testenv.RequireNVIDIALibraries(t)
	if _, err := os.Stat("/proc/driver/nvidia/version"); err == nil {
		t.Skip("the NVIDIA kernel driver is loaded here")
	}
	out, errOut, code := gpurun("--", "/bin/true")
	lines := strings.Split(strings.TrimSpace(errOut), "\n")
	if code == 0 || out != "" || len(lines) != 1 || !strings.Contains(lines[0], "driver not loaded") || !strings.Contains(lines[0], "--simulate") {
		t.Fatalf("exit %d, stderr %q: want one line about the driver", code, errOut)
	}
}

// TestUsage: gpurun's own errors exit 125 (as docker run's) with one line;
// --help alone prints the usage.
func TestUsage(t *testing.T) {
	corrupt := t.TempDir()
	if err := os.WriteFile(filepath.Join(corrupt, "allocations.json"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, args := range map[string][]string{
		"no command":        {"--simulate", "pcie8"},
		"bad cgroup":        {"--cgroup", "v3", "--", "true"},
		"unknown flag":      {"--gpu", "1", "--", "true"},
		"bad flag value":    {"--gpus", "two", "--", "true"},
		"gpus with devices": {"--gpus", "2", "--devices", "1,3", "--", "true"},
		"bad policy":        {"--simulate", "pcie8", "--policy", "random", "--", "true"},
		"unknown node":      {"--simulate", "dgx-z9", "--", "true"},
		"too many GPUs":     {"--simulate", "pcie8", "--gpus", "9", "--", "true"},
		"unknown device":    {"--simulate", "pcie8", "--devices", "42", "--", "true"},
		"corrupt state":     {"--simulate", "pcie8", "--state-dir", corrupt, "--", "true"},
	} {
		t.Run(name, func(t *testing.T) {
			switch name {
			case "too many GPUs", "unknown device", "bad policy", "unknown node", "corrupt state":
				testenv.RequireRoot(t) // gets as far as the simulated host
			}
			_, errOut, code := gpurun(args...)
			if code != exitFailed || strings.Count(errOut, "\n") != 1 {
				t.Fatalf("gpurun %q: exit %d, stderr %q; want %d and one line", args, code, errOut, exitFailed)
			}
		})
	}
	if _, errOut, code := gpurun("--help"); code != 0 || !strings.Contains(errOut, "usage:") {
		t.Errorf("--help: exit %d, stderr %q", code, errOut)
	}
}

// TestCommandExitCodes: a command that cannot be found exits 127, one that
// cannot be run 126, as under docker run.
func TestCommandExitCodes(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCgroupV1Devices(t)
	notExec := filepath.Join(t.TempDir(), "data")
	if err := os.WriteFile(notExec, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		cmd  string
		want int
	}{{"no-such-command-here", 127}, {"/no/such/file", 127}, {notExec, 126}} {
		if _, errOut, code := gpurun("--simulate", "pcie8", "--cgroup", "v1", "--quiet", "--", tc.cmd); code != tc.want {
			t.Errorf("gpurun -- %s: exit %d, want %d (stderr %q)", tc.cmd, code, tc.want, errOut)
		}
	}
}
