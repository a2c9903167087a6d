package containerizer_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/containerizer/docker"
	"github.com/gpuiso/gpuiso/containerizer/native"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/isolator/cgroups"
)

// The native containerizer starts this binary again as each container's
// init.
func TestMain(m *testing.M) {
	native.Init()
	testenv.Main(m)
}

// TestLifecycleNativeAndDocker runs real native and Docker containers side
// by side through one Lifecycle over both runtimes and one allocator on a
// simulated 8-GPU node: their GPUs are disjoint, each sees exactly its own
// GPU nodes, the node's ninth GPU request fails, and a restarted Lifecycle
// (new allocator over the same state, new runtimes over the same state
// directory and daemon) recovers all of them with their GPUs.
func TestLifecycleNativeAndDocker(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCgroupV1Devices(t)
	cli := testenv.RequireDocker(t)
	testenv.LockDocker(t, false)
	node, _, inv := testenv.SimulatedNode(t, "pcie8")
	probe := testenv.BuildProbe(t)
	img := testenv.BuildProbeImage(t, cli, testenv.ProbeImage{})
	ns := fmt.Sprintf("test-side-by-side-%d", time.Now().UnixNano())
	t.Cleanup(func() { removeNamespace(cli, ns) })
	base := t.TempDir()
	allocState, nativeState := filepath.Join(base, "alloc"), filepath.Join(base, "native")
	parent := fmt.Sprintf("gpuiso-composite-test-%d", os.Getpid())
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	build := func() (*containerizer.Lifecycle, *allocator.Allocator, *cgroups.Isolator) {
		t.Helper()
		alloc, err := allocator.New(inv, allocator.WithStateDir(allocState))
		if err != nil {
			t.Fatal(err)
		}
		iso, err := cgroups.New(cgroups.WithVersion(cgroups.V1), cgroups.WithMount("/sys/fs/cgroup/devices"), cgroups.WithParent(parent))
		if err != nil {
			t.Fatal(err)
		}
		nrt, err := native.NewRuntime(native.Config{Inventory: inv, Isolator: iso, StateDir: nativeState})
		if err != nil {
			t.Fatal(err)
		}
		drt, err := docker.NewRuntime(cli, docker.WithNamespace(ns), docker.WithStopTimeout(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		c, err := containerizer.NewLifecycle(containerizer.LifecycleConfig{Runtimes: []containerizer.Runtime{nrt, drt}, Allocator: alloc})
		if err != nil {
			t.Fatal(err)
		}
		return c, alloc, iso
	}
	c, _, iso := build()
	t.Cleanup(func() {
		for _, ct := range c.Containers() {
			c.Destroy(context.Background(), ct.ID)
		}
		os.Remove(filepath.Join(filepath.Dir(filepath.Dir(iso.Path("x"))), parent))
	})

	var all []string
	for i := range node.Len() {
		all = append(all, fmt.Sprintf("/dev/nvidia%d", node.Minor(i)))
	}
	launch := func(id, image string, n int, out *bytes.Buffer, cmd ...string) containerizer.Container {
		t.Helper()
		spec := containerizer.Spec{ID: id, Image: image, Command: cmd, GPUs: allocator.Request{Count: n}}
		if out != nil {
			spec.Stdout, spec.Stderr = out, out
		}
		if image == "" {
			spec.Command = append([]string{probe}, cmd...)
		}
		ct, err := c.Launch(ctx, spec)
		if err != nil {
			t.Fatalf("launch %s: %v", id, err)
		}
		return ct
	}
	// Two that keep running, and two that look around while they do.
	long := []containerizer.Container{
		launch("native-long", "", 3, nil, "sleep", "120"),
		launch("docker-long", img, 3, nil, "sleep", "120"),
	}
	var nOut, dOut bytes.Buffer
	look := []containerizer.Container{
		launch("native-look", "", 1, &nOut, append([]string{"open"}, all...)...),
		launch("docker-look", img, 1, &dOut, append([]string{"open"}, all...)...),
	}
	if _, err := c.Launch(ctx, containerizer.Spec{ID: "ninth", Image: img, GPUs: allocator.Request{Count: 1}}); err == nil {
		t.Fatal("a ninth GPU was handed out")
	}
	held := map[string]string{}
	for _, ct := range append(slices.Clone(long), look...) {
		for _, g := range ct.GPUs {
			if other, dup := held[g.UUID]; dup {
				t.Fatalf("GPU %s given to %s and %s", g.UUID, other, ct.ID)
			}
			held[g.UUID] = ct.ID
		}
	}
	if long[0].Kind != containerizer.KindNative || long[1].Kind != containerizer.KindDocker {
		t.Fatalf("kinds %s, %s", long[0].Kind, long[1].Kind)
	}
	for i, out := range []*bytes.Buffer{&nOut, &dOut} {
		ct := look[i]
		if st, err := c.Wait(ctx, ct.ID); err != nil || st.Code != 0 {
			t.Fatalf("%s: exit %+v, %v\n%s", ct.ID, st, err, out)
		}
		own := fmt.Sprintf("/dev/nvidia%d", ct.GPUs[0].Minor)
		for _, p := range all {
			want := "ENOENT"
			if p == own {
				want = "ENXIO"
			}
			if !strings.Contains(out.String(), p+" "+want+"\n") {
				t.Errorf("%s: want %s %s in:\n%s", ct.ID, p, want, out)
			}
		}
	}

	// Restarted.
	c2, alloc2, _ := build()
	c = c2 // cleanup destroys through the new one
	cs, err := c2.Recover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, ct := range cs {
		ids = append(ids, string(ct.Kind)+":"+ct.ID)
	}
	// The exited containers of both runtimes are adopted as exited, with
	// their GPUs, until destroyed.
	if want := []string{"docker:docker-long", "docker:docker-look", "native:native-long", "native:native-look"}; !slices.Equal(ids, want) {
		t.Fatalf("recovered %v, want %v", ids, want)
	}
	for _, ct := range long {
		a, err := alloc2.Allocation(ct.ID)
		if err != nil || fmt.Sprint(a.Devices) != fmt.Sprint(ct.GPUs) {
			t.Fatalf("%s after recovery holds %+v, %v; want %+v", ct.ID, a.Devices, err, ct.GPUs)
		}
	}
	for _, ct := range look {
		if st, err := c2.Wait(ctx, ct.ID); err != nil || st.Code != 0 {
			t.Fatalf("%s after recovery: exit %+v, %v", ct.ID, st, err)
		}
	}
	for _, id := range []string{"native-long", "docker-long", "docker-look", "native-look"} {
		if err := c2.Destroy(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if a := alloc2.Allocations(); len(a) != 0 {
		t.Fatalf("allocations left: %+v", a)
	}
	list, err := cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: make(client.Filters).Add("label", docker.LabelNamespace+"="+ns)})
	if err != nil || len(list.Items) != 0 {
		t.Fatalf("docker containers left: %d, %v", len(list.Items), err)
	}
}
