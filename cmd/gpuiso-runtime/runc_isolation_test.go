package main

import (
	"context"
	"fmt"
	"os/exec"
	"testing"
	"time"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
)

// TestRuncIsolation runs a bundle asking for GPUs 2 and 3 of a simulated
// DGX-1 through gpuiso-runtime run and runc alone (no engine, so the
// bundle's environment is the caller's: --accept-env-request always): the
// container has exactly those GPUs' nodes, may open them, and a node it
// makes itself of every other GPU is denied (EPERM) by the device rules
// runc enforces: its eBPF device filter on a cgroup2-only host, the v1
// devices controller elsewhere.
func TestRuncIsolation(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireNVIDIALibraries(t)
	testenv.RequireRunc(t)
	bin := buildRuntime(t)
	sim, major, gpus := simNode(t, "dgx1-volta")
	dir := probeBundle(t, testenv.BuildProbe(t), func(proc map[string]any) {
		proc["args"] = append([]string{"/probe"}, probeArgs(major, gpus)...)
		proc["env"] = append(proc["env"].([]any), "NVIDIA_VISIBLE_DEVICES=2,3")
		// The probe makes device nodes of its own.
		caps := proc["capabilities"].(map[string]any)
		for _, set := range []string{"bounding", "effective", "permitted"} {
			caps[set] = append(caps[set].([]any), "CAP_MKNOD")
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	id := fmt.Sprintf("gpuiso-isolation-%d", time.Now().UnixNano())
	out, err := exec.CommandContext(ctx, bin, "--simulate", "dgx1-volta", "--dev-root", sim, "--accept-env-request", "always", "--root", t.TempDir(), "run", "--bundle", dir, id).CombinedOutput()
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out)
	}
	checkIsolation(t, string(out), gpus, Expect{GPUs: []int{2, 3}, Control: true, Volume: true})
}
