package main

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuiso/gpuiso/internal/testenv"
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
