package main

import (
	"os"
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
)

// TestCPUAffinity runs, on a host with two NUMA nodes (the cgroup2-only
// VM), `gpurun --simulate dgx1-volta --devices 4 --cpu-affinity numa --
// grep Cpus_allowed_list /proc/self/status`: GPU 4 hangs off NUMA node 1,
// so the command sees node 1's CPUs; without --cpu-affinity it sees every
// CPU of gpurun's.
func TestCPUAffinity(t *testing.T) {
	testenv.RequireRoot(t)
	cpus := testenv.RequireNUMA(t, "")
	out, errOut, code := gpurun("--simulate", "dgx1-volta", "--devices", "4", "--cpu-affinity", "numa", "--", "grep", "Cpus_allowed_list", "/proc/self/status")
	if want := "Cpus_allowed_list:\t" + cpus[1] + "\n"; code != 0 || out != want {
		t.Fatalf("exit %d, stdout %q, stderr %q; want %q", code, out, errOut, want)
	}
	t.Logf("GPU 4 on NUMA node 1: %s", strings.TrimSpace(out))
	out, errOut, code = gpurun("--simulate", "dgx1-volta", "--devices", "4", "--quiet", "--", "grep", "Cpus_allowed_list", "/proc/self/status")
	if want := "Cpus_allowed_list:\t" + ownCPUs(t) + "\n"; code != 0 || out != want {
		t.Fatalf("without --cpu-affinity: exit %d, stdout %q, stderr %q; want %q", code, out, errOut, want)
	}
}

// TestCPUAffinityRefused: an unknown --cpu-affinity is gpurun's own error,
// in one line, before anything runs.
func TestCPUAffinityRefused(t *testing.T) {
	out, errOut, code := gpurun("--simulate", "dgx1-volta", "--cpu-affinity", "socket", "--", "true")
	if code != 125 || out != "" || strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, "--cpu-affinity") {
		t.Fatalf("exit %d, stdout %q, stderr %q; want 125 and one line about --cpu-affinity", code, out, errOut)
	}
}

// ownCPUs is this process's Cpus_allowed_list.
func ownCPUs(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for l := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(l, "Cpus_allowed_list:"); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatal("no Cpus_allowed_list in /proc/self/status")
	return ""
}
