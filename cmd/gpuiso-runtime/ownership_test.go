package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
)

// heldBy is what the owners of container id hold, in any runc root (an
// owner is the id, a dot and 12 hex digits naming the root).
func heldBy(got map[string][]int, id string) []int {
	var out []int
	for o, gpus := range got {
		if rest, ok := strings.CutPrefix(o, id+"."); ok && len(rest) == 12 && !strings.Contains(rest, ".") {
			out = append(out, gpus...)
		}
	}
	return out
}

// owners reads the allocator's state in dir: each owner's GPU indexes
// (the shared GPU of a share).
func owners(t *testing.T, dir string) map[string][]int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "allocations.json"))
	if os.IsNotExist(err) {
		return map[string][]int{}
	}
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		State struct {
			Owners []struct {
				Owner   string `json:"owner"`
				Devices []struct {
					Index int `json:"index"`
				} `json:"devices"`
				Shared *struct {
					Index int `json:"index"`
				} `json:"shared"`
			} `json:"owners"`
		} `json:"state"`
	}
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatalf("allocator state: %v\n%s", err, b)
	}
	out := map[string][]int{}
	for _, o := range st.State.Owners {
		for _, d := range o.Devices {
			out[o.Owner] = append(out[o.Owner], d.Index)
		}
		if o.Shared != nil {
			out[o.Owner] = append(out[o.Owner], o.Shared.Index)
		}
	}
	return out
}

// TestOwnershipAcrossClients: Docker and Podman, both running containers
// through gpuiso-runtime with one state directory, never share a GPU: a
// container of one asking for a GPU a live container of the other holds is
// refused with one line from gpuiso-runtime, and nothing is created; once
// the holder is removed, the GPU is given out again.
func TestOwnershipAcrossClients(t *testing.T) {
	podman := testenv.RequirePodman(t)
	testenv.RequireNVIDIALibraries(t)
	bin := buildRuntime(t)
	sim, _, _ := simNode(t, "dgx1-volta")
	state := t.TempDir()
	d, dockerImg := gpuisoDockerd(t, bin, nil, "--simulate", "dgx1-volta", "--dev-root", sim, "--state-dir", state)
	podmanImg := testenv.BuildPodmanProbeImage(t, podman)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// podmanRun runs podmanImg with flags and the probe command cmd.
	podmanRun := func(name string, flags []string, cmd ...string) (string, error) {
		a := append([]string{"run", "--name", name, "--network", "none", "--runtime", bin,
			"--runtime-flag", "simulate=dgx1-volta", "--runtime-flag", "dev-root=" + sim, "--runtime-flag", "state-dir=" + state}, testenv.PodmanRunFlags...)
		t.Cleanup(func() { testenv.RunPodman(context.Background(), podman, "rm", "-f", "-t", "0", name) })
		return testenv.RunPodman(ctx, podman, append(append(append(a, flags...), podmanImg), cmd...)...)
	}
	// podmanState is what Podman says of a container, "" if it knows none.
	podmanState := func(name string) string {
		out, _ := testenv.RunPodman(ctx, podman, "ps", "-a", "--filter", "name=^"+name+"$", "--format", "{{.State}}")
		return strings.TrimSpace(out)
	}

	// Docker holds GPU 2.
	out, err := d.Docker(ctx, "run", "-d", "--network", "none", "--runtime", "gpuiso", "-e", "NVIDIA_VISIBLE_DEVICES=2", dockerImg, "sleep", "600")
	if err != nil {
		t.Fatal(err)
	}
	dockerID := strings.TrimSpace(out)
	if got := owners(t, state); !slices.Equal(heldBy(got, dockerID), []int{2}) || len(got) != 1 {
		t.Fatalf("after docker run: owners %v, want %s holding GPU 2", got, dockerID)
	}

	// A delete of that id in another runc root, or without flags (runc's
	// default root), gives nothing back.
	for _, args := range [][]string{
		{"--simulate", "dgx1-volta", "--dev-root", sim, "--state-dir", state, "--root", t.TempDir(), "delete", "--force", dockerID},
		{"delete", "--force", dockerID},
	} {
		if out, err := runtimeOut(t, bin, args...); err != nil {
			t.Errorf("delete in another root: %v\n%s", err, out)
		}
		if got := owners(t, state); !slices.Equal(heldBy(got, dockerID), []int{2}) || len(got) != 1 {
			t.Fatalf("after %q: owners %v, want %s holding GPU 2", args, got, dockerID)
		}
	}

	// Podman asking for GPUs 1 and 2 is refused; nothing is created.
	name := fmt.Sprintf("gpuiso-own-%d", time.Now().UnixNano())
	out, err = podmanRun(name, []string{"-d", "-e", "NVIDIA_VISIBLE_DEVICES=1,2"}, "exit")
	if err == nil {
		t.Fatalf("podman run of GPU 2 held by docker's %s succeeded:\n%s", dockerID, out)
	}
	var refusal []string
	for l := range strings.Lines(out) {
		if strings.Contains(l, "gpuiso-runtime: ") {
			refusal = append(refusal, l)
		}
	}
	if len(refusal) != 1 || !strings.Contains(refusal[0], "owned by "+dockerID) {
		t.Errorf("want one gpuiso-runtime line naming the holder %s:\n%s", dockerID, out)
	}
	// Podman keeps the record of a container it could not create; the
	// runtime created nothing.
	if st := strings.ToLower(podmanState(name)); st != "" && st != "created" && st != "configured" && st != "exited" {
		t.Errorf("the refused podman container %s is %q", name, st)
	}
	if id, err := testenv.RunPodman(ctx, podman, "inspect", "--format", "{{.Id}}", name); err == nil {
		if out, err := exec.Command("runc", "--root", "/run/runc", "state", strings.TrimSpace(id)).CombinedOutput(); err == nil {
			t.Errorf("runc has the refused container %s: %s", name, out)
		}
	}
	if got := owners(t, state); len(got) != 1 || !slices.Equal(heldBy(got, dockerID), []int{2}) {
		t.Errorf("after the refusal: owners %v, want only %s holding GPU 2", got, dockerID)
	}

	// Podman holds GPU 5; Docker asking for it is refused.
	holder := fmt.Sprintf("gpuiso-own-%d", time.Now().UnixNano())
	if out, err := podmanRun(holder, []string{"-d", "-e", "NVIDIA_VISIBLE_DEVICES=5"}, "sleep", "600"); err != nil {
		t.Fatalf("podman run of free GPU 5: %v\n%s", err, out)
	}
	before, _ := d.Docker(ctx, "ps", "-q", "--no-trunc")
	out, err = d.Docker(ctx, "run", "-d", "--network", "none", "--runtime", "gpuiso", "-e", "NVIDIA_VISIBLE_DEVICES=5", dockerImg, "sleep", "600")
	if err == nil || !strings.Contains(out, "device unavailable") {
		t.Errorf("docker run of GPU 5 held by podman's container: %v\n%s", err, out)
	}
	after, _ := d.Docker(ctx, "ps", "-q", "--no-trunc")
	if strings.Fields(after)[0] != dockerID || len(strings.Fields(after)) != 1 {
		t.Errorf("running docker containers %q (were %q), want only %s", after, before, dockerID)
	}

	// Docker's container removed: its GPU goes to Podman.
	if _, err := d.Docker(ctx, "rm", "-f", dockerID); err != nil {
		t.Fatal(err)
	}
	if got := owners(t, state); len(heldBy(got, dockerID)) != 0 {
		t.Errorf("after docker rm: owners %v still list %s", got, dockerID)
	}
	if out, err := podmanRun(fmt.Sprintf("gpuiso-own-%d", time.Now().UnixNano()), []string{"--rm", "-e", "NVIDIA_VISIBLE_DEVICES=2"}, "env", "NVIDIA_VISIBLE_DEVICES"); err != nil {
		t.Errorf("podman run of GPU 2 after docker released it: %v\n%s", err, out)
	}
}

// TestOwnershipDeadContainer: with runc alone, a container's claim is held
// by its init process: refused to another container while it lives, given
// out again once it is dead, though nobody deleted it.
func TestOwnershipDeadContainer(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireRunc(t)
	bin := buildRuntime(t)
	sim, _, _ := simNode(t, "dgx1-volta")
	state := t.TempDir()
	root := t.TempDir() // runc's state
	probe := testenv.BuildProbe(t)
	global := []string{"--simulate", "dgx1-volta", "--dev-root", sim, "--state-dir", state, "--root", root, "--accept-env-request", "always"}
	rt := func(args ...string) (string, error) {
		return runtimeOut(t, bin, append(slices.Clone(global), args...)...)
	}
	mkBundle := func(env string) string { return sleepBundle(t, probe, env) }
	id := fmt.Sprintf("gpuiso-dead-%d", time.Now().UnixNano())
	forgetContainer(t, id, root)
	forgetContainer(t, id+"-b", root)
	if out, err := rt("create", "--bundle", mkBundle("3"), id); err != nil {
		t.Fatalf("create %s: %v\n%s", id, err, out)
	}
	if got := owners(t, state); !slices.Equal(heldBy(got, id), []int{3}) {
		t.Fatalf("owners %v, want %s holding GPU 3", got, id)
	}
	second := mkBundle("3")
	out, err := rt("create", "--bundle", second, id+"-b")
	if err == nil || strings.Count(out, "\n") != 1 || !strings.HasPrefix(out, "gpuiso-runtime: ") || !strings.Contains(out, "owned by "+id) {
		t.Fatalf("second create of GPU 3 while %s lives: %v\n%s", id, err, out)
	}
	if _, err := exec.Command("runc", "--root", root, "state", id+"-b").CombinedOutput(); err == nil {
		t.Errorf("the refused container %s-b exists in runc", id)
	}
	// The first container dies, and nobody deletes it.
	if out, err := exec.Command("runc", "--root", root, "kill", id, "KILL").CombinedOutput(); err != nil {
		t.Fatalf("runc kill: %v: %s", err, out)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		st, _ := exec.Command("runc", "--root", root, "state", id).Output()
		if strings.Contains(string(st), `"status": "stopped"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s does not stop: %s", id, st)
		}
	}
	if out, err := rt("create", "--bundle", second, id+"-b"); err != nil {
		t.Fatalf("create of GPU 3 after %s died: %v\n%s", id, err, out)
	}
	if got := owners(t, state); len(heldBy(got, id)) != 0 || !slices.Equal(heldBy(got, id+"-b"), []int{3}) {
		t.Errorf("owners %v, want only %s-b holding GPU 3", got, id)
	}
	if out, err := rt("delete", "--force", id+"-b"); err != nil {
		t.Fatalf("delete: %v\n%s", err, out)
	}
	if got := owners(t, state); len(got) != 0 {
		t.Errorf("after delete: owners %v, want none", got)
	}
}

// runtimeOut runs gpuiso-runtime with args and its output in a file: a
// created container keeps the standard files runc create had, and would
// hold a pipe open.
func runtimeOut(t *testing.T, bin string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	f, err := os.CreateTemp(t.TempDir(), "out")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	err = cmd.Run()
	out, _ := os.ReadFile(f.Name())
	return string(out), err
}

// sleepBundle writes a runc bundle (runc spec) whose process is the probe
// sleeping, with NVIDIA_VISIBLE_DEVICES=env, and returns its directory.
func sleepBundle(t *testing.T, probe, env string) string {
	t.Helper()
	return probeBundle(t, probe, func(proc map[string]any) {
		proc["args"] = []string{"/probe", "sleep", "600"}
		proc["env"] = append(proc["env"].([]any), "NVIDIA_VISIBLE_DEVICES="+env)
	})
}

// probeBundle makes a runc bundle (runc spec) whose root holds the probe
// program alone, with no terminal, lets edit change its process (args,
// env, capabilities) and returns its directory.
func probeBundle(t *testing.T, probe string, edit func(proc map[string]any)) string {
	t.Helper()
	dir := t.TempDir()
	rootfs := filepath.Join(dir, "rootfs")
	if err := os.MkdirAll(rootfs, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(probe)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rootfs, "probe"), b, 0o755); err != nil {
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
	edit(proc)
	if raw, err = json.Marshal(spec); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestOwnershipConcurrent: containers created at the same time, all asking
// for GPU 3 with one state directory: exactly one gets it, every other is
// refused in one line and runc created nothing for it.
func TestOwnershipConcurrent(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireRunc(t)
	bin := buildRuntime(t)
	sim, _, _ := simNode(t, "dgx1-volta")
	state, root := t.TempDir(), t.TempDir()
	probe := testenv.BuildProbe(t)
	const n = 6
	ids := make([]string, n)
	bundles := make([]string, n)
	for i := range n {
		ids[i] = fmt.Sprintf("gpuiso-race-%d-%d", i, time.Now().UnixNano())
		bundles[i] = sleepBundle(t, probe, "3")
	}
	for _, id := range ids {
		forgetContainer(t, id, root)
	}
	outs := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[i], errs[i] = runtimeOut(t, bin, "--simulate", "dgx1-volta", "--dev-root", sim, "--state-dir", state, "--root", root, "--accept-env-request", "always", "create", "--bundle", bundles[i], ids[i])
		}()
	}
	wg.Wait()
	var winners []string
	for i := range n {
		_, stateErr := exec.Command("runc", "--root", root, "state", ids[i]).CombinedOutput()
		switch {
		case errs[i] == nil:
			winners = append(winners, ids[i])
			if stateErr != nil {
				t.Errorf("%s created, but runc does not know it", ids[i])
			}
		case strings.Count(outs[i], "\n") != 1 || !strings.HasPrefix(outs[i], "gpuiso-runtime: ") || !strings.Contains(outs[i], "device unavailable"):
			t.Errorf("%s: %v: want one refusal line:\n%s", ids[i], errs[i], outs[i])
		case stateErr == nil:
			t.Errorf("%s refused, but runc created it", ids[i])
		}
	}
	if len(winners) != 1 {
		t.Fatalf("%d containers got GPU 3: %v", len(winners), winners)
	}
	if got := owners(t, state); len(got) != 1 || !slices.Equal(heldBy(got, winners[0]), []int{3}) {
		t.Errorf("owners %v, want only %s holding GPU 3", got, winners[0])
	}
}
