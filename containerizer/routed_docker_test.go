package containerizer_test

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/containerizer/docker"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/node"
)

// TestLifecycleWithDocker runs a native container (an in-test runtime) and
// a Docker container side by side through one Lifecycle over both
// runtimes and one allocator: their GPUs are disjoint, the Docker
// container sees only its own, and a restarted Lifecycle recovers both.
func TestLifecycleWithDocker(t *testing.T) {
	testenv.RequireRoot(t)
	cli := testenv.RequireDocker(t)
	testenv.LockDocker(t, false)
	sim, _, inv := testenv.SimulatedNode(t, "pcie8")
	img := testenv.BuildProbeImage(t, cli, testenv.ProbeImage{})
	ns := fmt.Sprintf("test-routed-%d", time.Now().UnixNano())
	t.Cleanup(func() { removeNamespace(cli, ns) })
	stateDir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// The native containers outlive a restart: the in-test runtime keeps them.
	native := &fakeRuntime{kind: containerizer.KindNative, ctrs: map[string]*fakeCtr{}}
	build := func() (*containerizer.Lifecycle, *allocator.Allocator) {
		t.Helper()
		alloc, err := allocator.New(inv, allocator.WithStateDir(stateDir))
		if err != nil {
			t.Fatal(err)
		}
		drt, err := docker.NewRuntime(cli, docker.WithNamespace(ns), docker.WithStopTimeout(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		// The allocator is given once, to the Lifecycle over both runtimes.
		c, err := containerizer.NewLifecycle(containerizer.LifecycleConfig{Runtimes: []containerizer.Runtime{native, drt}, Allocator: alloc})
		if err != nil {
			t.Fatal(err)
		}
		return c, alloc
	}
	c, _ := build()

	n1, err := c.Launch(ctx, containerizer.Spec{ID: "n1", Command: []string{"sleep", "60"}, GPUs: allocator.Request{Count: 4}})
	if err != nil {
		t.Fatal(err)
	}
	var all []string
	for i := range sim.Len() {
		all = append(all, fmt.Sprintf("/dev/nvidia%d", sim.Minor(i)))
	}
	var out bytes.Buffer
	d1, err := c.Launch(ctx, containerizer.Spec{ID: "d1", Image: img, Command: append([]string{"open"}, all...), GPUs: allocator.Request{Count: 4}, Stdout: &out})
	if err != nil {
		t.Fatal(err)
	}
	if n1.Kind != containerizer.KindNative || d1.Kind != containerizer.KindDocker {
		t.Fatalf("kinds %s and %s", n1.Kind, d1.Kind)
	}
	for _, g := range d1.GPUs {
		if slices.ContainsFunc(n1.GPUs, func(h node.DeviceRef) bool { return h.UUID == g.UUID }) {
			t.Fatalf("GPU %s given to both n1 and d1", g.UUID)
		}
	}
	if st, err := c.Wait(ctx, "d1"); err != nil || st.Code != 0 {
		t.Fatalf("Wait(d1) = %+v, %v", st, err)
	}
	for l := range strings.Lines(out.String()) {
		path, res, _ := strings.Cut(strings.TrimSpace(l), " ")
		own := slices.ContainsFunc(d1.GPUs, func(g node.DeviceRef) bool { return path == fmt.Sprintf("/dev/nvidia%d", g.Minor) })
		if want := map[bool]string{true: "ENXIO", false: "ENOENT"}[own]; res != want {
			t.Errorf("in d1, open %s = %s, want %s", path, res, want)
		}
	}
	if n := strings.Count(out.String(), "\n"); n != len(all) {
		t.Fatalf("d1 answered %d opens, want %d:\n%s", n, len(all), out.String())
	}

	// Restarted: a new allocator over the same state, a new Docker runtime
	// over the same daemon, the native containers as they were.
	c2, alloc2 := build()
	cs, err := c2.Recover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 2 || cs[0].ID != "d1" || cs[0].Kind != containerizer.KindDocker || cs[1].ID != "n1" || cs[1].Kind != containerizer.KindNative {
		t.Fatalf("recovered %+v, want d1 (docker) and n1 (native)", cs)
	}
	for _, want := range []containerizer.Container{n1, d1} {
		a, err := alloc2.Allocation(want.ID)
		if err != nil || fmt.Sprint(a.Devices) != fmt.Sprint(want.GPUs) {
			t.Fatalf("allocation of %s after recovery = %+v, %v; want %+v", want.ID, a.Devices, err, want.GPUs)
		}
	}
	if st, err := c2.Wait(ctx, "d1"); err != nil || st.Code != 0 {
		t.Fatalf("Wait(d1) after recovery = %+v, %v", st, err)
	}
	for _, id := range []string{"n1", "d1"} {
		if err := c2.Destroy(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if a := alloc2.Allocations(); len(a) != 0 {
		t.Fatalf("allocations left: %+v", a)
	}
	list, err := cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: make(client.Filters).Add("label", docker.LabelNamespace+"="+ns)})
	if err != nil || len(list.Items) != 0 {
		t.Fatalf("containers left: %+v, %v", list.Items, err)
	}
}

// removeNamespace removes the containers a failed test left in ns.
func removeNamespace(cli *client.Client, ns string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	list, err := cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: make(client.Filters).Add("label", docker.LabelNamespace+"="+ns)})
	if err != nil {
		return
	}
	for _, s := range list.Items {
		cli.ContainerRemove(ctx, s.ID, client.ContainerRemoveOptions{Force: true})
	}
}
