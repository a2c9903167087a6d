package containerizer_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
)

// updatingRuntime is a fakeRuntime that resizes its containers' GPUs in
// the Lifecycle's allocator (containerizer.Updater).
type updatingRuntime struct {
	*fakeRuntime
}

func (u updatingRuntime) Update(ctx context.Context, alloc *allocator.Allocator, rec containerizer.Record, gpus int) (containerizer.Record, error) {
	al, err := alloc.Resize(ctx, rec.ID, gpus)
	if err != nil {
		return rec, err
	}
	rec.GPUs = al.Devices
	u.mu.Lock()
	defer u.mu.Unlock()
	if c, ok := u.ctrs[rec.RuntimeID]; ok {
		c.rec.GPUs = al.Devices // what it lists from now on
	}
	return rec, nil
}

// nativeAndDocker returns fake runtimes of both kinds (the native one an
// Updater) and a Lifecycle over both and alloc.
func nativeAndDocker(t *testing.T, alloc *allocator.Allocator) (*fakeRuntime, *fakeRuntime, *containerizer.Lifecycle) {
	t.Helper()
	n, d := &fakeRuntime{kind: containerizer.KindNative, ctrs: map[string]*fakeCtr{}}, &fakeRuntime{kind: containerizer.KindDocker, ctrs: map[string]*fakeCtr{}}
	return n, d, overBoth(t, n, d, alloc)
}

// overBoth is a Lifecycle over n and d (a restarted one, over runtimes
// that kept their containers).
func overBoth(t *testing.T, n, d *fakeRuntime, alloc *allocator.Allocator) *containerizer.Lifecycle {
	t.Helper()
	l, err := containerizer.NewLifecycle(containerizer.LifecycleConfig{Runtimes: []containerizer.Runtime{updatingRuntime{n}, d}, Allocator: alloc})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func simAllocator(t *testing.T, name string) (*node.Inventory, *allocator.Allocator) {
	t.Helper()
	sim, err := simnode.New(name)
	if err != nil {
		t.Fatal(err)
	}
	inv, err := nvmlnode.Discover(context.Background(), nvmlnode.WithNVML(sim.NVML()))
	if err != nil {
		t.Fatal(err)
	}
	alloc, err := allocator.New(inv)
	if err != nil {
		t.Fatal(err)
	}
	return inv, alloc
}

// created is how many containers rt has created so far.
func (f *fakeRuntime) created() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.next
}

// TestLifecycleRoutes: one Lifecycle over a native and a Docker runtime
// routes each spec by kind; both draw on its one allocator, so GPUs are
// never handed out twice, and ids are unique across both.
func TestLifecycleRoutes(t *testing.T) {
	_, alloc := simAllocator(t, "pcie8")
	native, docker, c := nativeAndDocker(t, alloc)
	ctx := context.Background()

	// Four of each, launched at once: disjoint GPUs from the one allocator.
	var wg sync.WaitGroup
	got := make([]containerizer.Container, 8)
	errs := make([]error, 8)
	for i := range 8 {
		spec := containerizer.Spec{ID: fmt.Sprintf("job-%d", i), Command: []string{"true"}, GPUs: allocator.Request{Count: 1}}
		if i%2 == 1 {
			spec.Image = "probe"
		}
		wg.Go(func() { got[i], errs[i] = c.Launch(ctx, spec) })
	}
	wg.Wait()
	seen := map[string]bool{}
	for i, ctr := range got {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		want := containerizer.KindNative
		if i%2 == 1 {
			want = containerizer.KindDocker
		}
		if ctr.Kind != want || len(ctr.GPUs) != 1 || seen[ctr.GPUs[0].UUID] {
			t.Fatalf("job-%d = %+v: want kind %s and a GPU of its own", i, ctr, want)
		}
		seen[ctr.GPUs[0].UUID] = true
	}
	if native.created() != 4 || docker.created() != 4 || len(c.Containers()) != 8 {
		t.Fatalf("native %d, docker %d, lifecycle %d containers; want 4, 4, 8", native.created(), docker.created(), len(c.Containers()))
	}
	if _, err := c.Launch(ctx, containerizer.Spec{ID: "ninth", Image: "probe", Command: []string{"true"}, GPUs: allocator.Request{Count: 1}}); !errors.Is(err, node.ErrInsufficient) {
		t.Fatalf("ninth launch = %v, want ErrInsufficient", err)
	}

	tests := []struct {
		name string
		spec containerizer.Spec
		want error
	}{
		{"native id again as docker", containerizer.Spec{ID: "job-0", Image: "probe", Command: []string{"true"}}, containerizer.ErrContainerExists},
		{"docker id again as native", containerizer.Spec{ID: "job-1", Command: []string{"true"}}, containerizer.ErrContainerExists},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := native.created() + docker.created()
			if _, err := c.Launch(ctx, tt.spec); !errors.Is(err, tt.want) {
				t.Fatalf("Launch = %v, want %v", err, tt.want)
			}
			if native.created()+docker.created() != before {
				t.Fatal("a refused launch reached a runtime")
			}
		})
	}

	docker.end("job-3", 3)
	if st, err := c.Wait(ctx, "job-3"); err != nil || st.Code != 3 {
		t.Fatalf("Wait = %+v, %v", st, err)
	}
	if _, err := c.Update(ctx, "job-1", 2); !errors.Is(err, containerizer.ErrNotSupported) {
		t.Fatalf("Update of a docker container = %v, want ErrNotSupported", err)
	}
	if err := c.Destroy(ctx, "job-2"); err != nil {
		t.Fatal(err)
	}
	if ct, err := c.Update(ctx, "job-0", 2); err != nil || len(ct.GPUs) != 2 || ct.Kind != containerizer.KindNative {
		t.Fatalf("Update of a native container = %+v, %v", ct, err)
	}
	for _, op := range []func() error{
		func() error { _, err := c.Wait(ctx, "nobody"); return err },
		func() error { _, err := c.Update(ctx, "nobody", 1); return err },
	} {
		if err := op(); !errors.Is(err, containerizer.ErrUnknownContainer) {
			t.Fatalf("on an unknown container: %v, want ErrUnknownContainer", err)
		}
	}
	if err := c.Destroy(ctx, "nobody"); err != nil {
		t.Fatalf("Destroy(nobody) = %v", err)
	}
	for i := range 8 {
		if err := c.Destroy(ctx, fmt.Sprintf("job-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if len(alloc.Allocations()) != 0 || len(c.Containers()) != 0 || native.created() != 4 || len(native.ctrs)+len(docker.ctrs) != 0 {
		t.Fatalf("left after destroy: %+v, %+v", alloc.Allocations(), c.Containers())
	}
	// The id is free again, on either side.
	if _, err := c.Launch(ctx, containerizer.Spec{ID: "job-0", Image: "probe", Command: []string{"true"}, GPUs: allocator.Request{Count: 1}}); err != nil {
		t.Fatal(err)
	}
}

// TestLifecycleOneRuntime: a spec of a kind no runtime runs is refused
// with ErrNotSupported and holds nothing; a Lifecycle over one runtime
// gives it every spec, whatever its kind (its Image decides).
func TestLifecycleOneRuntime(t *testing.T) {
	ctx := context.Background()
	_, alloc := simAllocator(t, "pcie8")
	docker := &fakeRuntime{kind: containerizer.KindDocker, ctrs: map[string]*fakeCtr{}}
	only := newFakeRuntime()
	l, err := containerizer.NewLifecycle(containerizer.LifecycleConfig{Runtimes: []containerizer.Runtime{docker, only}, Allocator: alloc})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Launch(ctx, containerizer.Spec{ID: "n", Command: []string{"true"}, GPUs: allocator.Request{Count: 1}}); !errors.Is(err, containerizer.ErrNotSupported) {
		t.Fatalf("native launch without a native runtime = %v, want ErrNotSupported", err)
	}
	if len(alloc.Allocations()) != 0 || only.created() != 0 {
		t.Fatal("a refused launch holds GPUs or reached a runtime")
	}
	one := newLifecycle(t, only, alloc, nil)
	for _, spec := range []containerizer.Spec{
		{ID: "a", Command: []string{"true"}},
		{ID: "b", Image: "probe", Command: []string{"true"}},
	} {
		if ct, err := one.Launch(ctx, spec); err != nil || ct.Kind != "fake" {
			t.Fatalf("launch %s over one runtime: %+v, %v", spec.ID, ct, err)
		}
	}
}

// TestLifecycleRecoverRuntimes: after a restart the containers of both
// runtimes are recovered and routed again, and the allocator is reconciled
// once against the union of what they list: GPUs held for owners neither
// knows are released, another live process's are not. When a runtime
// cannot list, the other is recovered and nothing is released. An owner
// with a container in both runtimes is reported and adopted in neither.
func TestLifecycleRecoverRuntimes(t *testing.T) {
	ctx := context.Background()
	_, alloc := simAllocator(t, "dgx1-volta")
	native, docker, c := nativeAndDocker(t, alloc)
	for _, spec := range []containerizer.Spec{
		{ID: "n1", Command: []string{"x"}, GPUs: allocator.Request{Count: 2}},
		{ID: "d1", Image: "probe", Command: []string{"x"}, GPUs: allocator.Request{Count: 2}},
	} {
		if _, err := c.Launch(ctx, spec); err != nil {
			t.Fatal(err)
		}
	}
	// A container that died with the old process: its GPUs are still held.
	if _, err := alloc.Allocate(ctx, "ghost", allocator.Request{Count: 1}); err != nil {
		t.Fatal(err)
	}
	// Another live process's GPUs (this test's parent), which no runtime
	// here lists.
	parent, err := allocator.ProcessHolder("", os.Getppid())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := alloc.Allocate(ctx, "elsewhere", allocator.Request{Count: 1, Holder: &parent}); err != nil {
		t.Fatal(err)
	}

	docker.failList = errors.New("daemon down")
	c2 := overBoth(t, native, docker, alloc)
	cs, err := c2.Recover(ctx)
	if err == nil {
		t.Fatal("Recover with a failing runtime succeeded")
	}
	if len(cs) != 1 || cs[0].ID != "n1" {
		t.Fatalf("recovered %+v with the docker runtime down, want n1", cs)
	}
	if _, err := alloc.Allocation("ghost"); err != nil {
		t.Fatalf("a failed recovery released GPUs: %v", err)
	}
	docker.failList = nil

	c3 := overBoth(t, native, docker, alloc)
	cs, err = c3.Recover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 2 || cs[0].ID != "d1" || cs[0].Kind != containerizer.KindDocker || cs[1].ID != "n1" || cs[1].Kind != containerizer.KindNative {
		t.Fatalf("recovered %+v, want d1 (docker) and n1 (native)", cs)
	}
	if _, err := alloc.Allocation("ghost"); !errors.Is(err, allocator.ErrUnknownOwner) {
		t.Fatalf("ghost's GPUs after recovery: %v, want released", err)
	}
	if _, err := alloc.Allocation("elsewhere"); err != nil {
		t.Fatalf("another live process's GPUs after recovery: %v, want kept", err)
	}
	for _, id := range []string{"n1", "d1"} {
		if a, err := alloc.Allocation(id); err != nil || len(a.Devices) != 2 {
			t.Fatalf("allocation of %s = %+v, %v", id, a, err)
		}
	}
	if _, err := c3.Update(ctx, "n1", 3); err != nil {
		t.Fatalf("Update routed to the native runtime after recovery: %v", err)
	}
	if _, err := c3.Launch(ctx, containerizer.Spec{ID: "d1", Command: []string{"x"}}); !errors.Is(err, containerizer.ErrContainerExists) {
		t.Fatalf("Launch of a recovered id = %v, want ErrContainerExists", err)
	}

	// The same owner in both runtimes: one is reported, and not adopted.
	al, _ := alloc.Allocation("n1")
	docker.mu.Lock()
	docker.ctrs["twin"] = &fakeCtr{rec: containerizer.Record{ID: "n1", RuntimeID: "twin", GPUs: al.Devices}, started: true, done: make(chan struct{})}
	docker.mu.Unlock()
	cs, err = overBoth(t, native, docker, alloc).Recover(ctx)
	if !errors.Is(err, containerizer.ErrNotAdopted) || !errors.Is(err, containerizer.ErrContainerExists) {
		t.Fatalf("recover with n1 in both runtimes: %v", err)
	}
	for _, ct := range cs {
		if ct.ID == "n1" && ct.Kind != containerizer.KindNative {
			t.Fatalf("n1 adopted as %s", ct.Kind)
		}
	}
}

// TestLifecycleDestroyDuringLaunchRouted: a Destroy that comes while a
// launch on one of several runtimes is in progress waits for it and then
// destroys the container, so nothing is left held; a Launch of the same
// id on the other runtime meanwhile is refused. Run with -race.
func TestLifecycleDestroyDuringLaunchRouted(t *testing.T) {
	ctx := context.Background()
	_, alloc := simAllocator(t, "dgx1-volta")
	native, _, c := nativeAndDocker(t, alloc)
	native.gate, native.entered = make(chan struct{}), make(chan struct{}, 1)
	launched := make(chan error, 1)
	go func() {
		_, err := c.Launch(ctx, containerizer.Spec{ID: "a", Command: []string{"x"}, GPUs: allocator.Request{Count: 2}})
		launched <- err
	}()
	<-native.entered // the launch holds its GPUs and is not done
	destroyed := make(chan error, 1)
	go func() { destroyed <- c.Destroy(ctx, "a") }()
	if _, err := c.Launch(ctx, containerizer.Spec{ID: "a", Image: "probe", Command: []string{"x"}}); !errors.Is(err, containerizer.ErrContainerExists) {
		t.Fatalf("a second launch of a launching id: %v", err)
	}
	if _, err := c.Wait(ctx, "a"); !errors.Is(err, containerizer.ErrUnknownContainer) {
		t.Fatalf("wait of a launching container: %v", err)
	}
	close(native.gate)
	if err := <-launched; err != nil {
		t.Fatal(err)
	}
	if err := <-destroyed; err != nil {
		t.Fatal(err)
	}
	if got := alloc.Allocations(); len(got) != 0 {
		t.Fatalf("held after a destroy during launch: %+v", got)
	}
	if got := c.Containers(); len(got) != 0 {
		t.Fatalf("containers after a destroy during launch: %+v", got)
	}
}
