package main

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/cgroups/v3"
	"github.com/containerd/cgroups/v3/cgroup2"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
)

// TestResources runs a container with --cpu-shares 512 and --memory 256
// MiB and reads, from inside, the cgroup it is in: on a host with only
// cgroup2, one group of the unified hierarchy whose cpu.weight is the
// converted shares and whose memory.max is the limit (the cpu and memory
// controllers enabled for it); on v1, the cpu and memory hierarchies'
// cpu.shares and memory.limit_in_bytes.
func TestResources(t *testing.T) {
	requireCgroups(t)
	bin := buildAgent(t)
	state := filepath.Join(t.TempDir(), "state")
	const limit = 256 << 20
	script := `cg=$(sed -n 's/^0:://p' /proc/self/cgroup); echo "v2 $cg $(cat /sys/fs/cgroup$cg/cpu.weight) $(cat /sys/fs/cgroup$cg/memory.max)"`
	want := fmt.Sprintf("v2 /%s/ct- %d %d", "gpuiso-agent", cgroup2.ConvertCPUSharesToCgroupV2Value(512), limit)
	if cgroups.Mode() != cgroups.Unified {
		script = `cpu=$(awk -F: '$2 ~ /(^|,)cpu(,|$)/ {print $3}' /proc/self/cgroup)
			mem=$(awk -F: '$2 ~ /(^|,)memory(,|$)/ {print $3}' /proc/self/cgroup)
			echo "v1 $mem $(cat /sys/fs/cgroup/cpu$cpu/cpu.shares) $(cat /sys/fs/cgroup/memory$mem/memory.limit_in_bytes)"`
		want = fmt.Sprintf("v1 /%s/ct- %d %d", "gpuiso-agent", 512, limit)
	}
	out, err := exec.Command(bin, "--simulate", "dgx1-volta", "--gpus", "0", "--state-dir", state,
		"--cpu-shares", "512", "--memory", fmt.Sprint(limit), "--", "/bin/sh", "-c", script).Output()
	if err != nil {
		t.Fatalf("agent: %v\n%s", err, out)
	}
	f := strings.Fields(string(out))
	got := ""
	if len(f) == 4 {
		got = fmt.Sprintf("%s %s %s %s", f[0], f[1][:len("/gpuiso-agent/ct-")], f[2], f[3])
	}
	if got != want {
		t.Fatalf("the container sees %q, want %q", out, want)
	}
}

// TestCPUAffinity runs a container with --cpu-affinity numa on one GPU of
// a simulated DGX-1 (GPUs 0-3 on NUMA node 0, 4-7 on node 1) on a host with
// two NUMA nodes: it runs on its GPU's node's CPUs and memory.
func TestCPUAffinity(t *testing.T) {
	requireCgroups(t)
	cpus := testenv.RequireNUMA(t, "")
	bin := buildAgent(t)
	state := filepath.Join(t.TempDir(), "state")
	cmd := exec.Command(bin, "--simulate", "dgx1-volta", "--gpus", "1", "--state-dir", state, "--cpu-affinity", "numa",
		"--", "/bin/sh", "-c", "grep -E '^(Cpus|Mems)_allowed_list' /proc/self/status")
	var errOut strings.Builder
	cmd.Stderr = &errOut
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("agent: %v\n%s%s", err, out, errOut.String())
	}
	// "agent: container ct-…: GPUs N (GPU-…)"
	var gpu int
	if _, rest, ok := strings.Cut(errOut.String(), ": GPUs "); !ok {
		t.Fatalf("no GPU named on stderr: %q", errOut.String())
	} else if _, err := fmt.Sscanf(rest, "%d", &gpu); err != nil {
		t.Fatalf("no GPU named on stderr: %q", errOut.String())
	}
	node := gpu / 4
	if want := fmt.Sprintf("Cpus_allowed_list:\t%s\nMems_allowed_list:\t%d\n", cpus[node], node); string(out) != want {
		t.Fatalf("the container of GPU %d sees %q, want %q", gpu, out, want)
	}
}
