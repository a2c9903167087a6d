package containerizer_test

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/node"
)

// memRuntime is a Runtime that runs nothing: it keeps its containers in
// memory, says what the prepare step gave each, and ends a container's
// command when it is killed. A back end implements the same seven calls
// over the kernel (package native) or a daemon (package docker); the
// Lifecycle does the rest.
type memRuntime struct {
	kind containerizer.Kind // "memory" when empty

	mu   sync.Mutex
	recs map[string]containerizer.Record // by runtime id
	done map[string]chan struct{}
}

func (r *memRuntime) Kind() containerizer.Kind {
	if r.kind == "" {
		return "memory"
	}
	return r.kind
}

func (r *memRuntime) Image(_ context.Context, spec containerizer.Spec) (containerizer.Image, error) {
	if len(spec.Command) == 0 {
		return containerizer.Image{}, fmt.Errorf("%w: no command", containerizer.ErrInvalidSpec)
	}
	return containerizer.Image{}, nil
}

func (r *memRuntime) Create(_ context.Context, spec containerizer.Spec, p *containerizer.Prepared) (containerizer.Record, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, d := range p.Plan.Devices {
		fmt.Println("create", spec.ID, "with", d.Path)
	}
	rec := containerizer.Record{ID: spec.ID, RuntimeID: "mem-" + spec.ID}
	r.recs[rec.RuntimeID], r.done[rec.RuntimeID] = rec, make(chan struct{})
	return rec, nil
}

func (r *memRuntime) Start(context.Context, containerizer.Record) error { return nil }

func (r *memRuntime) Wait(ctx context.Context, rec containerizer.Record) (containerizer.ExitStatus, error) {
	r.mu.Lock()
	done := r.done[rec.RuntimeID]
	r.mu.Unlock()
	select {
	case <-done:
		return containerizer.ExitStatus{Code: 137}, nil
	case <-ctx.Done():
		return containerizer.ExitStatus{}, ctx.Err()
	}
}

func (r *memRuntime) Kill(_ context.Context, rec containerizer.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if done, ok := r.done[rec.RuntimeID]; ok {
		close(done)
		delete(r.done, rec.RuntimeID)
	}
	return nil
}

func (r *memRuntime) Remove(_ context.Context, rec containerizer.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.recs, rec.RuntimeID)
	return nil
}

func (r *memRuntime) List(context.Context) ([]containerizer.Record, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []containerizer.Record
	for _, rec := range r.recs {
		out = append(out, rec)
	}
	return out, nil
}

// A Lifecycle over a runtime of one's own: Launch allocates the GPUs,
// prepares the container's isolation and hands both to the runtime;
// Destroy kills it, removes it and gives the GPUs back.
func ExampleLifecycle() {
	pix := node.Link{PCIe: node.PCIeSingleSwitch}
	topo, err := node.NewTopology([][]node.Link{{{}, pix}, {pix, {}}})
	if err != nil {
		fmt.Println(err)
		return
	}
	inv := &node.Inventory{
		Topology: topo,
		Devices: []node.Device{
			{Index: 0, UUID: "GPU-00000000-0000-0000-0000-000000000000", Node: node.DeviceNode{Path: "/dev/nvidia0", Major: 195, Minor: 0}, Health: node.Healthy()},
			{Index: 1, Minor: 1, UUID: "GPU-11111111-1111-1111-1111-111111111111", Node: node.DeviceNode{Path: "/dev/nvidia1", Major: 195, Minor: 1}, Health: node.Healthy()},
		},
	}
	alloc, err := allocator.New(inv)
	if err != nil {
		fmt.Println(err)
		return
	}
	l, err := containerizer.NewLifecycle(containerizer.LifecycleConfig{
		Runtime:   &memRuntime{recs: map[string]containerizer.Record{}, done: map[string]chan struct{}{}},
		Allocator: alloc,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := context.Background()
	c, err := l.Launch(ctx, containerizer.Spec{ID: "job-1", Command: []string{"train"}, GPUs: allocator.Request{Count: 1}})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(c.ID, c.Kind, c.State, c.GPUs[0].UUID)
	fmt.Println("allocations:", len(alloc.Allocations()))
	if err := l.Destroy(ctx, "job-1"); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("containers:", len(l.Containers()), "allocations:", len(alloc.Allocations()))
	// Output:
	// create job-1 with /dev/nvidia0
	// job-1 memory running GPU-00000000-0000-0000-0000-000000000000
	// allocations: 1
	// containers: 0 allocations: 0
}

// One Lifecycle over two runtimes and one allocator: a spec naming an
// image goes to the Docker runtime, any other to the native one; their
// GPUs come from the one allocator, and an id is one container's across
// both.
func ExampleLifecycle_runtimes() {
	pix := node.Link{PCIe: node.PCIeSingleSwitch}
	topo, err := node.NewTopology([][]node.Link{{{}, pix}, {pix, {}}})
	if err != nil {
		fmt.Println(err)
		return
	}
	inv := &node.Inventory{Topology: topo, Devices: []node.Device{
		{Index: 0, UUID: "GPU-00000000-0000-0000-0000-000000000000", Node: node.DeviceNode{Path: "/dev/nvidia0", Major: 195, Minor: 0}, Health: node.Healthy()},
		{Index: 1, Minor: 1, UUID: "GPU-11111111-1111-1111-1111-111111111111", Node: node.DeviceNode{Path: "/dev/nvidia1", Major: 195, Minor: 1}, Health: node.Healthy()},
	}}
	alloc, err := allocator.New(inv)
	if err != nil {
		fmt.Println(err)
		return
	}
	mem := func(kind containerizer.Kind) *memRuntime {
		return &memRuntime{kind: kind, recs: map[string]containerizer.Record{}, done: map[string]chan struct{}{}}
	}
	l, err := containerizer.NewLifecycle(containerizer.LifecycleConfig{
		Runtimes:  []containerizer.Runtime{mem(containerizer.KindNative), mem(containerizer.KindDocker)},
		Allocator: alloc,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := context.Background()
	for _, spec := range []containerizer.Spec{
		{ID: "train", Command: []string{"train"}, GPUs: allocator.Request{Count: 1}},
		{ID: "serve", Image: "serving:1", Command: []string{"serve"}, GPUs: allocator.Request{Count: 1}},
	} {
		c, err := l.Launch(ctx, spec)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(c.ID, c.Kind, c.GPUs[0].UUID)
	}
	_, err = l.Launch(ctx, containerizer.Spec{ID: "train", Image: "serving:1", Command: []string{"serve"}})
	fmt.Println(errors.Is(err, containerizer.ErrContainerExists))
	// Output:
	// create train with /dev/nvidia0
	// train native GPU-00000000-0000-0000-0000-000000000000
	// create serve with /dev/nvidia1
	// serve docker GPU-11111111-1111-1111-1111-111111111111
	// true
}
