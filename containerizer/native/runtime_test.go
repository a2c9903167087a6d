package native

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/containerizer/docker"
	"github.com/gpuiso/gpuiso/node"
)

// TestNewRuntime: NewRuntime needs an isolator and the node, and refuses
// an allocator or a volume manager (the Lifecycle's); New defaults the
// node to its allocator's. No root needed.
func TestNewRuntime(t *testing.T) {
	n := newBareNode(t)
	cases := []struct {
		name string
		cfg  Config
		want error
	}{
		{"isolator and node", Config{Inventory: n.inv, Isolator: n.iso, StateDir: t.TempDir()}, nil},
		{"no node", Config{Isolator: n.iso, StateDir: t.TempDir()}, node.ErrInvalid},
		{"no isolator", Config{Inventory: n.inv, StateDir: t.TempDir()}, node.ErrInvalid},
		{"an allocator", Config{Allocator: n.alloc, Inventory: n.inv, Isolator: n.iso, StateDir: t.TempDir()}, node.ErrInvalid},
		{"a relative state directory", Config{Inventory: n.inv, Isolator: n.iso, StateDir: "state"}, node.ErrInvalid},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rt, err := NewRuntime(tc.cfg)
			if tc.want != nil {
				if !errors.Is(err, tc.want) || rt != nil {
					t.Fatalf("built %v, %v; want %v", rt, err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if sup := rt.Supervisor(); sup == nil || *sup != rt.self {
				t.Fatalf("supervisor %+v, want this process", sup)
			}
		})
	}
	c, err := New(Config{Allocator: n.alloc, Isolator: n.iso, StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if c.Allocator() != n.alloc || c.rt.cfg.Inventory == nil || len(c.rt.cfg.Inventory.Devices) != len(n.inv.Devices) {
		t.Fatalf("built over %p with %v, want the allocator %p and its node", c.Allocator(), c.rt.cfg.Inventory, n.alloc)
	}
}

// dockerish is a runtime of kind docker that runs nothing: what a Docker
// runtime beside the native one looks like to the Lifecycle.
type dockerish struct{ ids []string }

func (d *dockerish) Kind() containerizer.Kind { return containerizer.KindDocker }
func (d *dockerish) Image(context.Context, containerizer.Spec) (containerizer.Image, error) {
	return containerizer.Image{OwnRoot: true}, nil
}
func (d *dockerish) Create(_ context.Context, spec containerizer.Spec, _ *containerizer.Prepared) (containerizer.Record, error) {
	d.ids = append(d.ids, spec.ID)
	return containerizer.Record{ID: spec.ID, RuntimeID: "d-" + spec.ID}, nil
}
func (d *dockerish) Start(context.Context, containerizer.Record) error { return nil }
func (d *dockerish) Wait(context.Context, containerizer.Record) (containerizer.ExitStatus, error) {
	return containerizer.ExitStatus{}, nil
}
func (d *dockerish) Kill(context.Context, containerizer.Record) error   { return nil }
func (d *dockerish) Remove(context.Context, containerizer.Record) error { return nil }
func (d *dockerish) List(context.Context) ([]containerizer.Record, error) {
	return nil, nil
}

// TestRuntimeBesideAnother: the native runtime and another under one
// Lifecycle over one allocator: native specs go to it, image specs to the
// other, their GPUs are disjoint, ids are unique across both, and a
// native container is held by this process as its supervisor. No root
// needed (the bare init).
func TestRuntimeBesideAnother(t *testing.T) {
	ctx := context.Background()
	n := newBareNode(t)
	rt, err := NewRuntime(Config{Inventory: n.inv, Isolator: n.iso, StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	rt.dev, rt.bare = n.dev, true
	other := &dockerish{}
	l, err := containerizer.NewLifecycle(containerizer.LifecycleConfig{Runtimes: []containerizer.Runtime{rt, other}, Allocator: n.alloc})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, ct := range l.Containers() {
			l.Destroy(context.Background(), ct.ID)
		}
	})
	seen := map[string]string{}
	for i, image := range []string{"", "img", "", "img"} {
		id := fmt.Sprintf("c%d", i)
		ct, err := l.Launch(ctx, containerizer.Spec{ID: id, Image: image, Command: []string{"sleep", "60"}, GPUs: allocator.Request{Count: 2}})
		if err != nil {
			t.Fatal(err)
		}
		want := containerizer.KindNative
		if image != "" {
			want = containerizer.KindDocker
		}
		if ct.Kind != want {
			t.Fatalf("%s ran as %s, want %s", id, ct.Kind, want)
		}
		for _, g := range ct.GPUs {
			if o, dup := seen[g.UUID]; dup {
				t.Fatalf("GPU %s given to %s and %s", g.UUID, o, id)
			}
			seen[g.UUID] = id
		}
	}
	if _, err := l.Launch(ctx, containerizer.Spec{ID: "c0", Image: "img", Command: []string{"x"}}); !errors.Is(err, containerizer.ErrContainerExists) {
		t.Fatalf("a native id again as an image: %v", err)
	}
	al, err := n.alloc.Allocation("c0")
	if err != nil || al.Holder == nil || *al.Holder != rt.self {
		t.Fatalf("c0's GPUs held by %+v, %v; want this process", al.Holder, err)
	}
	if al, _ := n.alloc.Allocation("c1"); al.Holder != nil {
		t.Fatalf("c1's GPUs held by %+v, want none (the other runtime has no supervisor)", al.Holder)
	}
	if _, err := l.Update(ctx, "c0", 1); err != nil {
		t.Fatalf("update a native container: %v", err)
	}
	if _, err := l.Update(ctx, "c1", 1); !errors.Is(err, containerizer.ErrNotSupported) {
		t.Fatalf("update the other's container: %v", err)
	}
	for _, id := range []string{"c0", "c1", "c2", "c3"} {
		if err := l.Destroy(ctx, id); err != nil {
			t.Fatal(err)
		}
		n.nothingLeft(t, id)
	}
}

// TestLifecycleRefusesUnmadeRuntimes: a native or Docker runtime not made
// by its constructor (a zero value, a typed nil) is refused by
// NewLifecycle with ErrNotMade, not a panic.
func TestLifecycleRefusesUnmadeRuntimes(t *testing.T) {
	n := newBareNode(t)
	for name, rt := range map[string]containerizer.Runtime{
		"native zero":      &Runtime{},
		"native typed nil": (*Runtime)(nil),
		"docker zero":      &docker.Runtime{},
		"docker typed nil": (*docker.Runtime)(nil),
	} {
		t.Run(name, func(t *testing.T) {
			l, err := containerizer.NewLifecycle(containerizer.LifecycleConfig{Runtime: rt, Allocator: n.alloc})
			if !errors.Is(err, containerizer.ErrNotMade) || !errors.Is(err, node.ErrInvalid) || l != nil {
				t.Fatalf("NewLifecycle = %v, %v; want ErrNotMade", l, err)
			}
		})
	}
}
