package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/isolator/mps"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
)

// TestSwarm runs services on a one-node swarm whose daemon advertises the 8
// GPUs of a simulated node by UUID as generic resources and runs every
// container through gpuiso-runtime (its default runtime): each task sees
// exactly the GPUs Swarm assigned it, the tasks' GPUs are disjoint, and a
// task asking for more GPUs than are left waits as pending.
func TestSwarm(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireNVIDIALibraries(t)
	bin := buildRuntime(t)
	sim, major, gpus := simNode(t, "dgx1-volta")
	n, err := simnode.New("dgx1-volta")
	if err != nil {
		t.Fatal(err)
	}
	host := &simnode.Host{Root: sim, DevRoot: sim + "/dev", ProcRoot: sim + "/proc", SysRoot: sim + "/sys"}
	inv, err := nvmlnode.Discover(context.Background(), n.DiscoverOptions(host)...)
	if err != nil {
		t.Fatal(err)
	}
	index := map[string]int{}
	var resources []string
	for _, g := range inv.Devices {
		index[g.UUID] = g.Index
		resources = append(resources, "NVIDIA-GPU="+g.UUID)
	}
	d, img := gpuisoDockerd(t, bin, map[string]any{"default-runtime": "gpuiso", "node-generic-resources": resources},
		"--simulate", "dgx1-volta", "--dev-root", sim)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := d.SwarmInit(ctx, freePort(t)); err != nil {
		t.Fatal(err)
	}
	service := func(name string, count int) {
		t.Helper()
		args := append([]string{"service", "create", "--detach", "--no-resolve-image", "--name", name, "--restart-condition", "none",
			"--generic-resource", fmt.Sprintf("NVIDIA-GPU=%d", count), img}, probeArgs(major, gpus)...)
		if _, err := d.Docker(ctx, append(args, "--", "sleep", "600")...); err != nil {
			t.Fatal(err)
		}
	}
	// seen waits for the task of service name to have run the probe and
	// returns the GPUs Swarm assigned it and the probe's answers.
	seen := func(name string) ([]int, string) {
		t.Helper()
		for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
			id, err := d.Docker(ctx, "ps", "-q", "--no-trunc", "--filter", "label=com.docker.swarm.service.name="+name)
			if err != nil || strings.TrimSpace(id) == "" {
				continue
			}
			id = strings.Fields(id)[0]
			logs, err := d.Docker(ctx, "logs", id)
			if err != nil || !strings.Contains(logs, "/usr/local/nvidia/x ") {
				continue
			}
			env, err := d.Docker(ctx, "inspect", "--format", `{{range .Config.Env}}{{println .}}{{end}}`, id)
			if err != nil {
				t.Fatal(err)
			}
			var assigned []int
			for l := range strings.Lines(env) {
				if v, ok := strings.CutPrefix(strings.TrimSpace(l), "DOCKER_RESOURCE_NVIDIA-GPU="); ok {
					for _, u := range strings.Split(v, ",") {
						i, ok := index[u]
						if !ok {
							t.Fatalf("Swarm assigned %q, no GPU of the node", u)
						}
						assigned = append(assigned, i)
					}
				}
			}
			slices.Sort(assigned)
			return assigned, logs
		}
		out, _ := d.Docker(ctx, "service", "ps", "--no-trunc", name)
		t.Fatalf("service %s: no task ran the probe in 2 min:\n%s", name, out)
		return nil, ""
	}

	service("two", 2)
	two, out := seen("two")
	if len(two) != 2 {
		t.Fatalf("service two: Swarm assigned %v", two)
	}
	checkIsolation(t, out, gpus, Expect{GPUs: two, Control: true, Volume: true})
	service("four", 4)
	four, out := seen("four")
	if len(four) != 4 || slices.ContainsFunc(four, func(i int) bool { return slices.Contains(two, i) }) {
		t.Fatalf("service four: Swarm assigned %v (two has %v)", four, two)
	}
	checkIsolation(t, out, gpus, Expect{GPUs: four, Control: true, Volume: true})

	// 6 of 8 GPUs assigned: a task asking for 4 waits.
	service("more", 4)
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(250 * time.Millisecond) {
		st, err := d.Docker(ctx, "service", "ps", "--no-trunc", "--format", "{{.CurrentState}} {{.Error}}", "more")
		if err == nil && strings.HasPrefix(st, "Pending") && strings.Contains(st, "insufficient resources") {
			break
		}
		if time.Now().After(deadline) {
			all, _ := d.Docker(ctx, "service", "ps", "--no-trunc", "more")
			t.Fatalf("service more (4 GPUs, 2 free): %v\n%q\n%s", err, st, all)
		}
	}
	if ids, _ := d.Docker(ctx, "ps", "-aq", "--filter", "label=com.docker.swarm.service.name=more"); strings.TrimSpace(ids) != "" {
		t.Errorf("the pending service has containers: %s", ids)
	}
}

// TestSwarmShare runs the seed's Swarm scenario on a simulated dgx1-volta
// whose one shareable GPU (--shared-gpus 0, a 16 GiB V100) the node
// advertises as a discrete generic resource, VRAM=16000 (MiB, per node):
// two services asking --generic-resource VRAM=8000 land as memory shares
// on GPU 0, each with an MPS daemon of its own; each sees only its GPU,
// its limit (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, and the default its daemon
// holds, asked through the container's /tmp/nvidia-mps) and its daemon's
// pipe directory; a third stays pending until one ends, then runs on GPU
// 0 too. After the services end, no daemon, directory, record or
// allocation is left.
func TestSwarmShare(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireNVIDIALibraries(t)
	testenv.RequireSimulatedMPS(t)
	bin := buildRuntime(t)
	sim, major, gpus := simNode(t, "dgx1-volta")
	state := t.TempDir()
	// After the daemon's containers are removed (its cleanup, registered
	// later, runs first): the daemons a failed run left.
	stopDaemonsAtEnd(t, state)
	d, img := gpuisoDockerd(t, bin, map[string]any{"default-runtime": "gpuiso", "node-generic-resources": []string{"VRAM=16000"}},
		"--simulate", "dgx1-volta", "--dev-root", sim, "--state-dir", state, "--shared-gpus", "0")
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	if err := d.SwarmInit(ctx, freePort(t)); err != nil {
		t.Fatal(err)
	}
	if out, err := d.Docker(ctx, "node", "inspect", "self", "--format", "{{json .Description.Resources.GenericResources}}"); err != nil || !strings.Contains(out, `"Kind":"VRAM","Value":16000`) {
		t.Fatalf("the node does not advertise VRAM=16000: %v\n%s", err, out)
	}
	service := func(name string, mib int) {
		t.Helper()
		args := []string{"service", "create", "--detach", "--no-resolve-image", "--name", name, "--restart-condition", "none",
			"--stop-grace-period", "1s", "--generic-resource", fmt.Sprintf("VRAM=%d", mib), img,
			"do", "env", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "CUDA_MPS_PIPE_DIRECTORY", "--", "ls", "/tmp/nvidia-mps", "--"}
		args = append(append(args, probeArgs(major, gpus)[1:]...), "--", "sleep", "600")
		if _, err := d.Docker(ctx, args...); err != nil {
			t.Fatal(err)
		}
	}
	type task struct {
		id     string
		pid    int
		daemon mps.Daemon
	}
	// running waits for the task of service name to have run the probe,
	// checks what it sees, and returns it.
	running := func(name string) task {
		t.Helper()
		for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
			id, err := d.Docker(ctx, "ps", "-q", "--no-trunc", "--filter", "label=com.docker.swarm.service.name="+name)
			if err != nil || strings.TrimSpace(id) == "" {
				continue
			}
			id = strings.Fields(id)[0]
			logs, err := d.Docker(ctx, "logs", id)
			if err != nil || !strings.Contains(logs, "/usr/local/nvidia/x ") {
				continue
			}
			checkIsolation(t, logs, gpus, Expect{GPUs: []int{0}, Control: true, Volume: true})
			for _, want := range []string{"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8000M", "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps", "control", "control_lock"} {
				if !strings.Contains(logs, want+"\n") {
					t.Errorf("service %s sees no %q:\n%s", name, want, logs)
				}
			}
			out, err := d.Docker(ctx, "inspect", "--format", "{{.State.Pid}}", id)
			if err != nil {
				t.Fatal(err)
			}
			pid, err := strconv.Atoi(strings.TrimSpace(out))
			if err != nil {
				t.Fatal(err)
			}
			var owner string
			for o, held := range owners(t, state) {
				if strings.HasPrefix(o, id+".") {
					owner = o
					if !slices.Equal(held, []int{0}) {
						t.Errorf("service %s holds GPUs %v, want a share of GPU 0", name, held)
					}
				}
			}
			dm, ok := daemonOf(t, state, owner)
			if owner == "" || !ok {
				t.Fatalf("service %s (container %s): owner %q, no MPS daemon", name, id, owner)
			}
			expectShare(t, pid, dm, 8000)
			return task{id: id, pid: pid, daemon: dm}
		}
		out, _ := d.Docker(ctx, "service", "ps", "--no-trunc", name)
		t.Fatalf("service %s: no task ran the probe in 2 min:\n%s", name, out)
		return task{}
	}
	// gone waits until the container of t is removed and its daemon
	// stopped.
	gone := func(tk task) {
		t.Helper()
		for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(250 * time.Millisecond) {
			ids, err := d.Docker(ctx, "ps", "-aq", "--no-trunc")
			if _, left := daemonOf(t, state, tk.daemon.Owner); err == nil && !strings.Contains(ids, tk.id) && !left {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("container %s: removed %v, daemon left %v", tk.id, !strings.Contains(ids, tk.id), true)
			}
		}
		expectDaemonGone(t, tk.daemon)
	}

	service("one", 8000)
	one := running("one")
	service("two", 8000)
	two := running("two")
	if one.daemon.Pid == two.daemon.Pid || one.daemon.PipeDir == two.daemon.PipeDir {
		t.Fatalf("services one and two share a daemon: %+v, %+v", one.daemon, two.daemon)
	}

	// 16000 of 16000 MiB assigned: a third waits.
	service("three", 8000)
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(250 * time.Millisecond) {
		st, err := d.Docker(ctx, "service", "ps", "--no-trunc", "--format", "{{.CurrentState}} {{.Error}}", "three")
		if err == nil && strings.HasPrefix(st, "Pending") && strings.Contains(st, "insufficient resources") {
			break
		}
		if time.Now().After(deadline) {
			all, _ := d.Docker(ctx, "service", "ps", "--no-trunc", "three")
			t.Fatalf("service three (8000 MiB, none left): %v\n%q\n%s", err, st, all)
		}
	}
	if ids, _ := d.Docker(ctx, "ps", "-aq", "--filter", "label=com.docker.swarm.service.name=three"); strings.TrimSpace(ids) != "" {
		t.Errorf("the pending service has containers: %s", ids)
	}
	if _, err := d.Docker(ctx, "service", "rm", "one"); err != nil {
		t.Fatal(err)
	}
	gone(one)
	three := running("three")
	if three.daemon.Pid == two.daemon.Pid {
		t.Fatalf("services two and three share a daemon")
	}

	if _, err := d.Docker(ctx, "service", "rm", "two", "three"); err != nil {
		t.Fatal(err)
	}
	gone(two)
	gone(three)
	if got := owners(t, state); len(got) != 0 {
		t.Errorf("allocations left: %v", got)
	}
	expectNoDaemons(t, state)
	if left, _ := filepath.Glob(filepath.Join(state, recordsDir, "*.json")); len(left) != 0 {
		t.Errorf("container records left: %q", left)
	}
	if list, err := os.ReadDir(filepath.Join(state, daemonsDir)); err != nil || slices.ContainsFunc(list, os.DirEntry.IsDir) {
		t.Errorf("daemon directories left in %s: %v %v", filepath.Join(state, daemonsDir), list, err)
	}

	// The same daemon, docker run: the caller's GPUISO_GPU_MEMORY and
	// GPUISO_GPU_COMPUTE ask for a share; an image's own ask for nothing.
	ask := []string{"do", "env", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "NVIDIA_VISIBLE_DEVICES", "--", "ls", "/dev", "/tmp/nvidia-mps"}
	out, err := d.Docker(ctx, append([]string{"run", "--rm", "--network", "none", "-e", "GPUISO_GPU_MEMORY=4GiB", "-e", "GPUISO_GPU_COMPUTE=50", img}, ask...)...)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50", "nvidia0", "control"} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("docker run -e GPUISO_GPU_MEMORY=4GiB -e GPUISO_GPU_COMPUTE=50: no %q:\n%s", want, out)
		}
	}
	own := testenv.BuildProbeImage(t, d.Client, testenv.ProbeImage{Env: map[string]string{"GPUISO_GPU_MEMORY": "16GiB", "NVIDIA_VISIBLE_DEVICES": "all"}})
	out, err = d.Docker(ctx, append([]string{"run", "--rm", "--network", "none", own}, ask...)...)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, "CUDA_MPS") || strings.Contains(out, "nvidia0\n") || strings.Contains(out, "control\n") {
		t.Errorf("an image's own GPUISO_GPU_MEMORY got a share:\n%s", out)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		list, err := mps.Daemons(ctx, filepath.Join(state, daemonsDir))
		if err == nil && len(list) == 0 && len(owners(t, state)) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after docker run --rm: daemons %+v (%v), allocations %v", list, err, owners(t, state))
		}
	}
}

// freePort returns a TCP port of 127.0.0.1 that nothing listens on now.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
