package native

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"sync"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/node"
)

// killPoints ends the goroutine that reaches its at-th point
// (runtime.Goexit), as a kill of the process would end it there: each
// step an update logs, and each call of the isolator and /dev it makes.
type killPoints struct {
	at     int
	mu     sync.Mutex
	armed  bool // points count from the update on
	points []string
}

func (k *killPoints) reach(point string) {
	k.mu.Lock()
	if !k.armed {
		k.mu.Unlock()
		return
	}
	k.points = append(k.points, point)
	n := len(k.points)
	k.mu.Unlock()
	if n == k.at {
		runtime.Goexit()
	}
}

func (k *killPoints) seen() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.points)
}

// Handle is the slog handler of the steps an update logs.
func (k *killPoints) Handle(_ context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "step" {
			k.reach(a.Value.String())
		}
		return true
	})
	return nil
}

func (k *killPoints) Enabled(context.Context, slog.Level) bool { return true }
func (k *killPoints) WithAttrs([]slog.Attr) slog.Handler       { return k }
func (k *killPoints) WithGroup(string) slog.Handler            { return k }

// killingIsolator is a recorder with a kill point before and after each
// Apply.
type killingIsolator struct {
	*recorder
	k *killPoints
}

func (i killingIsolator) Apply(ctx context.Context, id string, rules []isolator.Rule) error {
	i.k.reach("before apply")
	err := i.recorder.Apply(ctx, id, rules)
	i.k.reach("after apply")
	return err
}

// killingDev is a memDev with a kill point after each node added or
// removed.
type killingDev struct {
	*memDev
	k *killPoints
}

func (d killingDev) addNode(dir string, n isolator.DeviceNode) error {
	err := d.memDev.addNode(dir, n)
	d.k.reach("added " + n.Path)
	return err
}

func (d killingDev) removeNode(dir string, n isolator.DeviceNode) error {
	err := d.memDev.removeNode(dir, n)
	d.k.reach("removed " + n.Path)
	return err
}

// TestBareUpdateKillPoints kills the containerizer at every point of a
// grow and a shrink (each step it logs, each isolator and /dev call) and
// restarts it over the same state and allocator state: Recover adopts the
// container with what the allocator holds, its device rules, its /dev and
// its record exactly that; Destroy then leaves nothing. The points are
// found by an update not killed.
func TestBareUpdateKillPoints(t *testing.T) {
	for _, tc := range []struct {
		name     string
		from, to int
	}{
		{"grow", 1, 3},
		{"shrink", 3, 1},
	} {
		points := bareUpdateKilled(t, tc.from, tc.to, 0)
		if len(points) == 0 {
			t.Fatalf("%s: no kill point", tc.name)
		}
		for at := 1; at <= len(points); at++ {
			t.Run(fmt.Sprintf("%s/killed at %s (%d)", tc.name, points[at-1], at), func(t *testing.T) {
				bareUpdateKilled(t, tc.from, tc.to, at)
			})
		}
	}
}

// bareUpdateKilled launches a container of from GPUs, updates it to to
// with the containerizer killed at point at (none: 0), recovers with a new
// one and checks it; it returns the points reached.
func bareUpdateKilled(t *testing.T, from, to, at int) []string {
	t.Helper()
	ctx := context.Background()
	n := newBareNode(t)
	allocDir := t.TempDir()
	var err error
	if n.alloc, err = allocator.New(n.inv, allocator.WithStateDir(allocDir)); err != nil {
		t.Fatal(err)
	}
	k := &killPoints{at: at}
	first, err := New(Config{Allocator: n.alloc, Inventory: n.inv, Isolator: killingIsolator{n.iso, k}, StateDir: n.state, Logger: slog.New(k)})
	if err != nil {
		t.Fatal(err)
	}
	first.rt.dev, first.rt.bare = killingDev{n.dev, k}, true
	if _, err := first.Launch(ctx, containerizer.Spec{ID: "job", Command: []string{"sleep", "60"}, GPUs: allocator.Request{Count: from}}); err != nil {
		t.Fatal(err)
	}
	k.mu.Lock()
	k.armed = true
	k.mu.Unlock()
	done := make(chan error, 1)
	go func() {
		killed := true
		defer func() {
			if killed {
				done <- nil
			}
		}()
		_, err := first.Update(ctx, "job", to)
		killed = false
		done <- err
	}()
	if err := <-done; at == 0 && err != nil {
		t.Fatalf("update: %v", err)
	}
	points := k.seen()
	// A restart: the allocator's state as on disk, the containers as
	// they are.
	if n.alloc, err = allocator.New(n.inv, allocator.WithStateDir(allocDir)); err != nil {
		t.Fatal(err)
	}
	n.c = n.open(t)
	cs, err := n.c.Recover(ctx)
	if err != nil {
		t.Fatalf("recover after %v: %v", points, err)
	}
	if len(cs) != 1 || cs[0].ID != "job" || cs[0].State != containerizer.StateRunning {
		t.Fatalf("recovered %+v", cs)
	}
	al, err := n.alloc.Allocation("job")
	if err != nil {
		t.Fatalf("after %v: %v", points, err)
	}
	if len(al.Devices) != from && len(al.Devices) != to {
		t.Errorf("holds %d GPUs, want %d or %d", len(al.Devices), from, to)
	}
	var held, nodes []string
	var idx []int
	for _, d := range al.Devices {
		held = append(held, d.UUID)
		idx = append(idx, d.Index)
		nodes = append(nodes, fmt.Sprintf("nvidia%d", d.Minor))
	}
	slices.Sort(nodes)
	allowed := n.iso.allowed("job")
	for i := range n.inv.Devices {
		if want := slices.Contains(idx, i); slices.Contains(allowed, rulesOf(n.inv, i)[0]) != want {
			t.Errorf("after %v: GPU %d allowed = %v, held = %v", points, i, !want, want)
		}
	}
	if got := n.dev.names(n.c.rt.devDir("job")); !slices.Equal(got, nodes) {
		t.Errorf("after %v: /dev holds %v, want %v", points, got, nodes)
	}
	rec, err := n.c.rt.readRecord("job")
	if err != nil {
		t.Fatal(err)
	}
	if got := uuids(rec.GPUs); !slices.Equal(got, held) {
		t.Errorf("after %v: recorded %v, holds %v", points, got, held)
	}
	if got := uuids(cs[0].GPUs); !slices.Equal(got, held) {
		t.Errorf("after %v: adopted with %v, holds %v", points, got, held)
	}
	if err := n.c.Destroy(ctx, "job"); err != nil {
		t.Fatal(err)
	}
	n.nothingLeft(t, "job")
	return points
}

func uuids(refs []node.DeviceRef) []string {
	var out []string
	for _, d := range refs {
		out = append(out, d.UUID)
	}
	return out
}

// TestBareDestroyNotAdopted: a container Recover cannot adopt (its GPU
// is another owner's by then) is reported with one kind, and Destroy of
// its id removes it (its cgroup with its processes, /dev, state) and lets
// the id be launched again.
func TestBareDestroyNotAdopted(t *testing.T) {
	n := newBareNode(t)
	ctx := context.Background()
	_, err := n.c.Launch(ctx, containerizer.Spec{ID: "job", Command: []string{"sleep", "60"}, GPUs: allocator.Request{Devices: []string{"1"}}})
	if err != nil {
		t.Fatal(err)
	}
	// A restart whose allocator lost its state, another owner holding
	// the GPU meanwhile.
	if n.alloc, err = allocator.New(n.inv); err != nil {
		t.Fatal(err)
	}
	// Held by a live process (this test's parent), which the recovery's
	// reconciliation keeps.
	parent, err := allocator.ProcessHolder("", os.Getppid())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.alloc.Allocate(ctx, "other", allocator.Request{Devices: []string{"1"}, Holder: &parent}); err != nil {
		t.Fatal(err)
	}
	n.c = n.open(t)
	_, err = n.c.Recover(ctx)
	if !errors.Is(err, containerizer.ErrNotAdopted) || errors.Is(err, node.ErrUnavailable) || errors.Is(err, node.ErrExists) {
		t.Fatalf("recover: %v; want ErrNotAdopted alone of node's kinds", err)
	}
	if err := n.c.Destroy(ctx, "job"); err != nil {
		t.Fatal(err)
	}
	n.nothingLeft(t, "job")
	if al, err := n.alloc.Allocation("other"); err != nil || len(al.Devices) != 1 {
		t.Errorf("the other owner's GPU: %+v, %v", al, err)
	}
	if err := n.alloc.Release(ctx, "other"); err != nil {
		t.Fatal(err)
	}
	if _, err := n.c.Launch(ctx, containerizer.Spec{ID: "job", Command: []string{"sleep", "60"}, GPUs: allocator.Request{Count: 1}}); err != nil {
		t.Fatalf("launch of the id again: %v", err)
	}
}
