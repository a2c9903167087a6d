package containerizer_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
)

// fakeBackend is a containerizer that holds GPUs in the allocator and runs
// nothing: a stand-in for either back end. Its containers outlive it when
// handed to a new fakeBackend (what a restart leaves running).
type fakeBackend struct {
	kind       containerizer.Kind
	alloc      *allocator.Allocator
	recoverErr error
	reconciles bool
	// gate, when set, holds every launch after its allocation until it is
	// closed; entered is told when a launch reaches it.
	gate, entered chan struct{}

	mu         sync.Mutex
	containers map[string]containerizer.Container
	launches   int
}

func newFake(kind containerizer.Kind, alloc *allocator.Allocator) *fakeBackend {
	return &fakeBackend{kind: kind, alloc: alloc, containers: map[string]containerizer.Container{}}
}

// restarted is the back end after a restart: the same containers, a new
// process over alloc.
func (f *fakeBackend) restarted(alloc *allocator.Allocator) *fakeBackend {
	f.mu.Lock()
	defer f.mu.Unlock()
	return &fakeBackend{kind: f.kind, alloc: alloc, containers: maps.Clone(f.containers)}
}

func (f *fakeBackend) Launch(ctx context.Context, spec containerizer.Spec) (containerizer.Container, error) {
	if spec.ID == "" {
		return containerizer.Container{}, containerizer.ErrInvalidSpec
	}
	f.mu.Lock()
	f.launches++
	if _, ok := f.containers[spec.ID]; ok {
		f.mu.Unlock()
		return containerizer.Container{}, containerizer.ErrContainerExists
	}
	f.mu.Unlock()
	a, err := f.alloc.Allocate(ctx, spec.ID, spec.GPUs)
	if err != nil {
		return containerizer.Container{}, err
	}
	if f.gate != nil {
		f.entered <- struct{}{}
		<-f.gate
	}
	c := containerizer.Container{ID: spec.ID, Kind: f.kind, GPUs: a.Devices, State: containerizer.StateRunning}
	f.mu.Lock()
	f.containers[spec.ID] = c
	f.mu.Unlock()
	return c, nil
}

func (f *fakeBackend) get(id string) (containerizer.Container, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.containers[id]
	if !ok {
		return c, containerizer.ErrUnknownContainer
	}
	return c, nil
}

func (f *fakeBackend) Wait(ctx context.Context, id string) (containerizer.ExitStatus, error) {
	_, err := f.get(id)
	return containerizer.ExitStatus{Code: len(id)}, err
}

func (f *fakeBackend) Update(ctx context.Context, id string, gpus int) (containerizer.Container, error) {
	c, err := f.get(id)
	if err != nil {
		return c, err
	}
	if f.kind == containerizer.KindDocker {
		return containerizer.Container{}, containerizer.ErrNotSupported
	}
	a, err := f.alloc.Resize(ctx, id, gpus)
	if err != nil {
		return containerizer.Container{}, err
	}
	c.GPUs = a.Devices
	f.mu.Lock()
	f.containers[id] = c
	f.mu.Unlock()
	return c, nil
}

func (f *fakeBackend) Destroy(ctx context.Context, id string) error {
	if _, err := f.get(id); err != nil {
		return nil
	}
	if err := f.alloc.Release(ctx, id); err != nil && !errors.Is(err, allocator.ErrUnknownOwner) {
		return err
	}
	f.mu.Lock()
	delete(f.containers, id)
	f.mu.Unlock()
	return nil
}

func (f *fakeBackend) Recover(ctx context.Context) ([]containerizer.Container, error) {
	if f.recoverErr != nil {
		return nil, f.recoverErr
	}
	return f.Containers(), nil
}

func (f *fakeBackend) Allocator() *allocator.Allocator { return f.alloc }

func (f *fakeBackend) ReconcilesAllocator() bool { return f.reconciles }

func (f *fakeBackend) Containers() []containerizer.Container {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Collect(maps.Values(f.containers))
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

func TestCompositeRoutes(t *testing.T) {
	_, alloc := simAllocator(t, "pcie8")
	native, docker := newFake(containerizer.KindNative, alloc), newFake(containerizer.KindDocker, alloc)
	c, err := containerizer.NewComposite(alloc, native, docker)
	if err != nil {
		t.Fatal(err)
	}
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
	if len(native.Containers()) != 4 || len(docker.Containers()) != 4 || len(c.Containers()) != 8 {
		t.Fatalf("native %d, docker %d, composite %d containers; want 4, 4, 8", len(native.Containers()), len(docker.Containers()), len(c.Containers()))
	}
	if _, err := c.Launch(ctx, containerizer.Spec{ID: "ninth", Image: "probe", GPUs: allocator.Request{Count: 1}}); !errors.Is(err, node.ErrInsufficient) {
		t.Fatalf("ninth launch = %v, want ErrInsufficient", err)
	}

	tests := []struct {
		name string
		spec containerizer.Spec
		want error
	}{
		{"native id again as docker", containerizer.Spec{ID: "job-0", Image: "probe"}, containerizer.ErrContainerExists},
		{"docker id again as native", containerizer.Spec{ID: "job-1"}, containerizer.ErrContainerExists},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := native.launches + docker.launches
			if _, err := c.Launch(ctx, tt.spec); !errors.Is(err, tt.want) {
				t.Fatalf("Launch = %v, want %v", err, tt.want)
			}
			if native.launches+docker.launches != before {
				t.Fatal("a refused launch reached a back end")
			}
		})
	}

	if st, err := c.Wait(ctx, "job-3"); err != nil || st.Code != len("job-3") {
		t.Fatalf("Wait = %+v, %v", st, err)
	}
	if _, err := c.Update(ctx, "job-1", 2); !errors.Is(err, containerizer.ErrNotSupported) {
		t.Fatalf("Update of a docker container = %v, want ErrNotSupported", err)
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
	if len(alloc.Allocations()) != 0 || len(c.Containers()) != 0 {
		t.Fatalf("left after destroy: %+v, %+v", alloc.Allocations(), c.Containers())
	}
	// The id is free again, on either side.
	if _, err := c.Launch(ctx, containerizer.Spec{ID: "job-0", Image: "probe", GPUs: allocator.Request{Count: 1}}); err != nil {
		t.Fatal(err)
	}
}

func TestCompositeOneBackEnd(t *testing.T) {
	_, alloc := simAllocator(t, "pcie8")
	c, err := containerizer.NewComposite(alloc, nil, newFake(containerizer.KindDocker, alloc))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Launch(context.Background(), containerizer.Spec{ID: "n", GPUs: allocator.Request{Count: 1}}); !errors.Is(err, containerizer.ErrNotSupported) {
		t.Fatalf("native launch without a native back end = %v, want ErrNotSupported", err)
	}
	if len(alloc.Allocations()) != 0 {
		t.Fatal("a refused launch holds GPUs")
	}
	for _, tt := range []struct {
		name           string
		alloc          *allocator.Allocator
		native, docker containerizer.Containerizer
	}{
		{"no allocator", nil, newFake(containerizer.KindNative, alloc), nil},
		{"no back end", alloc, nil, nil},
	} {
		if _, err := containerizer.NewComposite(tt.alloc, tt.native, tt.docker); err == nil {
			t.Errorf("NewComposite with %s succeeded", tt.name)
		}
	}
}

// TestCompositeRecover: after a restart both back ends' containers are
// recovered and routed again, and GPUs held for owners neither back end
// knows are released; when a back end cannot recover, nothing is released.
func TestCompositeRecover(t *testing.T) {
	_, alloc := simAllocator(t, "dgx1-volta")
	native, docker := newFake(containerizer.KindNative, alloc), newFake(containerizer.KindDocker, alloc)
	c, _ := containerizer.NewComposite(alloc, native, docker)
	ctx := context.Background()
	for _, spec := range []containerizer.Spec{
		{ID: "n1", GPUs: allocator.Request{Count: 2}},
		{ID: "d1", Image: "probe", GPUs: allocator.Request{Count: 2}},
	} {
		if _, err := c.Launch(ctx, spec); err != nil {
			t.Fatal(err)
		}
	}
	// A container that died with the old process: its GPUs are still held.
	if _, err := alloc.Allocate(ctx, "ghost", allocator.Request{Count: 1}); err != nil {
		t.Fatal(err)
	}

	failing := docker.restarted(alloc)
	failing.recoverErr = errors.New("daemon down")
	c2, _ := containerizer.NewComposite(alloc, native.restarted(alloc), failing)
	if _, err := c2.Recover(ctx); err == nil {
		t.Fatal("Recover with a failing back end succeeded")
	}
	if _, err := alloc.Allocation("ghost"); err != nil {
		t.Fatalf("a failed recovery released GPUs: %v", err)
	}

	c3, _ := containerizer.NewComposite(alloc, native.restarted(alloc), docker.restarted(alloc))
	cs, err := c3.Recover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 2 || cs[0].ID != "d1" || cs[1].ID != "n1" {
		t.Fatalf("recovered %+v, want d1 and n1", cs)
	}
	if _, err := alloc.Allocation("ghost"); !errors.Is(err, allocator.ErrUnknownOwner) {
		t.Fatalf("ghost's GPUs after recovery: %v, want released", err)
	}
	for _, id := range []string{"n1", "d1"} {
		if a, err := alloc.Allocation(id); err != nil || len(a.Devices) != 2 {
			t.Fatalf("allocation of %s = %+v, %v", id, a, err)
		}
	}
	if _, err := c3.Update(ctx, "n1", 3); err != nil {
		t.Fatalf("Update routed to the native back end after recovery: %v", err)
	}
	if _, err := c3.Launch(ctx, containerizer.Spec{ID: "d1"}); !errors.Is(err, containerizer.ErrContainerExists) {
		t.Fatalf("Launch of a recovered id = %v, want ErrContainerExists", err)
	}
}

// TestCompositeDestroyDuringLaunch: a Destroy that comes while a launch is
// in progress waits for it and then destroys the container, so nothing is
// left held; a Launch of the same id meanwhile is refused. Run with -race.
func TestCompositeDestroyDuringLaunch(t *testing.T) {
	ctx := context.Background()
	_, alloc := simAllocator(t, "dgx1-volta")
	native := newFake(containerizer.KindNative, alloc)
	native.gate, native.entered = make(chan struct{}), make(chan struct{}, 1)
	c, err := containerizer.NewComposite(alloc, native, nil)
	if err != nil {
		t.Fatal(err)
	}
	launched := make(chan error, 1)
	go func() {
		_, err := c.Launch(ctx, containerizer.Spec{ID: "a", GPUs: allocator.Request{Count: 2}})
		launched <- err
	}()
	<-native.entered // the launch holds its GPUs and is not done
	destroyed := make(chan error, 1)
	go func() { destroyed <- c.Destroy(ctx, "a") }()
	if _, err := c.Launch(ctx, containerizer.Spec{ID: "a"}); !errors.Is(err, containerizer.ErrContainerExists) {
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

// TestCompositeOneAllocator: a Composite's back ends draw on its one
// allocator: Compose builds them from it, and NewComposite refuses back
// ends over another one or reconciling it on their own.
func TestCompositeOneAllocator(t *testing.T) {
	ctx := context.Background()
	_, alloc := simAllocator(t, "dgx1-volta")
	_, other := simAllocator(t, "dgx1-volta")
	build := func(kind containerizer.Kind) containerizer.Backend {
		return func(a *allocator.Allocator) (containerizer.Kind, containerizer.Containerizer, error) {
			return kind, newFake(kind, a), nil
		}
	}
	failing := func(*allocator.Allocator) (containerizer.Kind, containerizer.Containerizer, error) {
		return containerizer.KindDocker, nil, errors.New("no daemon")
	}
	reconciling := newFake(containerizer.KindNative, alloc)
	reconciling.reconciles = true
	cases := []struct {
		name string
		make func() (*containerizer.Composite, error)
		want error  // nil: made, unless msg
		msg  string // the error says this
	}{
		{"compose both", func() (*containerizer.Composite, error) {
			return containerizer.Compose(alloc, build(containerizer.KindNative), build(containerizer.KindDocker))
		}, nil, ""},
		{"compose one", func() (*containerizer.Composite, error) {
			return containerizer.Compose(alloc, build(containerizer.KindDocker))
		}, nil, ""},
		{"compose two of a kind", func() (*containerizer.Composite, error) {
			return containerizer.Compose(alloc, build(containerizer.KindNative), build(containerizer.KindNative))
		}, node.ErrInvalid, ""},
		{"compose a failing back end", func() (*containerizer.Composite, error) {
			return containerizer.Compose(alloc, build(containerizer.KindNative), failing)
		}, nil, "no daemon"},
		{"compose nothing", func() (*containerizer.Composite, error) { return containerizer.Compose(alloc) }, node.ErrInvalid, ""},
		{"compose without allocator", func() (*containerizer.Composite, error) {
			return containerizer.Compose(nil, build(containerizer.KindNative))
		}, node.ErrInvalid, ""},
		{"back end over another allocator", func() (*containerizer.Composite, error) {
			return containerizer.NewComposite(alloc, newFake(containerizer.KindNative, alloc), newFake(containerizer.KindDocker, other))
		}, containerizer.ErrAllocatorMismatch, ""},
		{"back end reconciling on its own", func() (*containerizer.Composite, error) {
			return containerizer.NewComposite(alloc, reconciling, nil)
		}, containerizer.ErrAllocatorMismatch, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := tc.make()
			if tc.msg != "" {
				if err == nil || !strings.Contains(err.Error(), tc.msg) || c != nil {
					t.Fatalf("made %v, %v; want an error saying %q", c, err, tc.msg)
				}
				return
			}
			if tc.want != nil {
				if !errors.Is(err, tc.want) || c != nil {
					t.Fatalf("made %v, %v; want %v", c, err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			ct, err := c.Launch(ctx, containerizer.Spec{ID: "a", Image: "img", GPUs: allocator.Request{Count: 1}})
			if err != nil {
				t.Fatal(err)
			}
			if held, err := alloc.Allocation("a"); err != nil || held.Devices[0].UUID != ct.GPUs[0].UUID {
				t.Fatalf("the back end did not draw on the composite's allocator: %+v, %v", held, err)
			}
			if err := c.Destroy(ctx, "a"); err != nil {
				t.Fatal(err)
			}
		})
	}
}
