package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/containerizer/native"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
)

func TestMain(m *testing.M) {
	native.Init() // this test binary is the containers' init
	if os.Getenv(asGpurunEnv) != "" {
		main() // a gpurun process of the multi-process tests
	}
	cleanup := testenv.OffHostTmp() // containers have a /tmp of their own
	code := m.Run()
	cleanup()
	os.Exit(code)
}

func gpurun(args ...string) (stdout, stderr string, code int) {
	var out, errOut testenv.Buffer
	code = run(context.Background(), args, strings.NewReader(""), &out, &errOut)
	return out.String(), errOut.String(), code
}

// TestSimulated runs a command on GPUs 1 and 3 of a simulated DGX-1, for
// each cgroup version the host has: it sees exactly its GPU nodes, and
// gpurun exits with its status after one line saying what it got.
func TestSimulated(t *testing.T) {
	testenv.RequireRoot(t)
	for _, v := range testenv.CgroupVersions(t) {
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
			out, errOut, code = gpurun("--simulate", "pcie8", "--quiet", "--cgroup", v, "--user", "1000:1000", "--cap-add", "SYS_PTRACE", "--",
				"/bin/sh", "-c", `id -u; grep -E '^Cap(Eff|Bnd)' /proc/self/status`)
			if code != 0 || out != "1000\nCapEff:\t0000000000000000\nCapBnd:\t00000000a80c25fb\n" {
				t.Fatalf("--user --cap-add: exit %d, stdout %q, stderr %q", code, out, errOut)
			}
		})
	}
}

// TestNoDriver: on this host's real node (no kernel driver) gpurun says so
// in one line and exits non-zero. (Without root it says that it needs
// root: TestNeedsRoot.)
func TestNoDriver(t *testing.T) {
	testenv.RequireRoot(t)
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
		"bad user":          {"--user", "nobody", "--", "true"},
		"bad capability":    {"--simulate", "pcie8", "--cap-add", "SYS_NOPE", "--", "true"},
		"bad rootfs":        {"--simulate", "pcie8", "--rootfs", "/nonexistent", "--", "true"},
	} {
		t.Run(name, func(t *testing.T) {
			switch name {
			case "too many GPUs", "unknown device", "bad policy", "unknown node", "corrupt state", "bad capability", "bad rootfs":
				testenv.RequireRoot(t) // gets as far as the simulated host
			}
			_, errOut, code := gpurun(args...)
			if code != exitFailed || strings.Count(errOut, "\n") != 1 {
				t.Fatalf("gpurun %q: exit %d, stderr %q; want %d and one line", args, code, errOut, exitFailed)
			}
		})
	}
	if out, errOut, code := gpurun("--help"); code != 0 || !strings.HasPrefix(out, "usage: gpurun") || errOut != "" {
		t.Errorf("--help: exit %d, stderr %q", code, errOut)
	}
}

// TestCommandExitCodes: a command that cannot be found exits 127, one that
// cannot be run 126, as under docker run.
func TestCommandExitCodes(t *testing.T) {
	testenv.RequireRoot(t)
	v, _ := testenv.RequireDeviceCgroup(t)
	notExec := filepath.Join(t.TempDir(), "data")
	if err := os.WriteFile(notExec, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		cmd  string
		want int
	}{{"no-such-command-here", 127}, {"/no/such/file", 127}, {notExec, 126}} {
		if _, errOut, code := gpurun("--simulate", "pcie8", "--cgroup", v, "--quiet", "--", tc.cmd); code != tc.want {
			t.Errorf("gpurun -- %s: exit %d, want %d (stderr %q)", tc.cmd, code, tc.want, errOut)
		}
	}
}

// TestSimulatedMIG runs a command on one 1g.10gb MIG device of a simulated
// HGX H100 with MIG: it sees its parent's node and two capability nodes (its
// GPU and compute instances'), and NVIDIA_VISIBLE_DEVICES names the MIG UUID.
func TestSimulatedMIG(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCgroupV2(t)
	probe := testenv.BuildProbe(t)
	out, errOut, code := gpurun("--simulate", "hgx-h100-mig", "--mig", "1g.10gb", "--cgroup", "v2", "--",
		"/bin/sh", "-c", `ls /dev | grep '^nvidia[0-9]'; ls /dev/nvidia-caps | wc -l; echo "$NVIDIA_VISIBLE_DEVICES"
			major=$((0x$(stat -c %t /dev/nvidia-caps/$(ls /dev/nvidia-caps | head -1))))
			top=$(for f in /dev/nvidia-caps/*; do echo $((0x$(stat -c %T $f))); done | sort -n | tail -1)
			`+probe+` mknod /dev/sibling $major $((top + 1)) open`)
	if code != 0 {
		t.Fatalf("exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	// Its parent's node, its GPU and compute instances' capability nodes, its
	// MIG UUID; a capability node it makes of a sibling instance is denied.
	if len(lines) != 5 || lines[0] != "nvidia1" || strings.TrimSpace(lines[1]) != "2" || !strings.HasPrefix(lines[2], "MIG-") ||
		strings.Contains(lines[2], ",") || lines[3] != "/dev/sibling ok" || lines[4] != "/dev/sibling EPERM" {
		t.Fatalf("the command saw %q\nstderr: %s", lines, errOut)
	}
	for name, args := range map[string][]string{
		"devices and mig": {"--devices", "1", "--mig", "1g.10gb", "--", "true"},
		"unknown profile": {"--simulate", "hgx-h100-mig", "--mig", "1g.5gb", "--", "true"},
	} {
		if _, errOut, code := gpurun(args...); code == 0 || errOut == "" {
			t.Errorf("%s: exit %d, stderr %q", name, code, errOut)
		}
	}
}
