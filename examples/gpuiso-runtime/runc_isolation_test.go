package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/gpuiso/gpuiso/internal/testenv"
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
	if _, err := exec.LookPath("runc"); err != nil {
		if testenv.Required(testenv.Root) {
			t.Fatalf("no runc: %v", err)
		}
		t.Skipf("no runc: %v", err)
	}
	bin := buildRuntime(t)
	sim, major, gpus := simNode(t, "dgx1-volta")
	dir := t.TempDir()
	rootfs := filepath.Join(dir, "rootfs")
	probe, err := os.ReadFile(testenv.BuildProbe(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(rootfs, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rootfs, "probe"), probe, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("runc", "spec", "--bundle", dir).CombinedOutput(); err != nil {
		t.Fatalf("runc spec: %v: %s", err, out)
	}
	cfg := filepath.Join(dir, "config.json")
	raw, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var spec map[string]any
	if err := json.Unmarshal(raw, &spec); err != nil {
		t.Fatal(err)
	}
	proc := spec["process"].(map[string]any)
	proc["terminal"] = false
	proc["args"] = append([]string{"/probe"}, probeArgs(major, gpus)...)
	proc["env"] = append(proc["env"].([]any), "NVIDIA_VISIBLE_DEVICES=2,3")
	// The probe makes device nodes of its own.
	caps := proc["capabilities"].(map[string]any)
	for _, set := range []string{"bounding", "effective", "permitted"} {
		caps[set] = append(caps[set].([]any), "CAP_MKNOD")
	}
	if raw, err = json.Marshal(spec); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	id := fmt.Sprintf("gpuiso-isolation-%d", time.Now().UnixNano())
	out, err := exec.CommandContext(ctx, bin, "--simulate", "dgx1-volta", "--dev-root", sim, "--accept-env-request", "always", "--root", t.TempDir(), "run", "--bundle", dir, id).CombinedOutput()
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out)
	}
	checkIsolation(t, string(out), gpus, Expect{GPUs: []int{2, 3}, Control: true, Volume: true})
}
