package conformance

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
)

// TestChainKilledInCgroupDelete: the agent killed inside the removal of a
// container's CPU and memory cgroup (containerd/cgroups removes the cpu
// hierarchy's directory first, then memory's) leaves the container's record
// and its memory cgroup, nothing else: the GPU isolator has cleaned up
// already. The random kills found it (the next start failed with "recover:
// container ct-…: cgroups: /gpuiso-agent/ct-… doesn't exist in cpu
// subsystem", and so did every later one). Here that state is made
// directly: the next start must remove both and exit 0.
func TestChainKilledInCgroupDelete(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCgroupV1Devices(t) // cgroup v1: the agent's cpu and memory hierarchies
	testenv.RequireNVIDIALibraries(t)
	bins := build(t)
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// A first start makes the state directory; then the dead container.
	if out, err := exec.CommandContext(ctx, bins.agent, "--simulate", simulated, "--state-dir", state).CombinedOutput(); err != nil {
		t.Fatalf("agent: %v\n%s", err, out)
	}
	done := exec.Command("true")
	if err := done.Run(); err != nil {
		t.Fatal(err)
	}
	id := "ct-00c0ffee0000"
	rec, err := json.Marshal(map[string]any{"id": id, "cgroup": "/" + agentParent + "/" + id,
		"process": map[string]any{"Pid": done.Process.Pid, "Start": 1}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(state, "containers", id+".json"), rec, 0o600); err != nil {
		t.Fatal(err)
	}
	memory := filepath.Join(cgroupRoot, "memory", agentParent, id)
	if err := os.MkdirAll(memory, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(memory) })

	out, err := exec.CommandContext(ctx, bins.agent, "--simulate", simulated, "--state-dir", state).CombinedOutput()
	if err != nil {
		t.Errorf("the next start: %v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(state, "containers", id+".json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the record of %s is left (%v)", id, err)
	}
	if _, err := os.Stat(memory); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the memory cgroup %s is left (%v)", memory, err)
	}
}
