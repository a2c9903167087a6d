package chain

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"sync"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/node"
)

// killPoints ends the goroutine that reaches its at-th point, once armed
// (runtime.Goexit), as a kill of the agent would end it there: each step
// an update logs, and each application of device rules (before, after).
type killPoints struct {
	at     int
	mu     sync.Mutex
	armed  bool
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

// killingDevices is the fake device cgroup with kill points around Apply.
type killingDevices struct {
	*fakeDevices
	k *killPoints
}

func (d killingDevices) Apply(ctx context.Context, parent, name string, rules []isolator.Rule) error {
	d.k.reach("before apply")
	err := d.fakeDevices.Apply(ctx, parent, name, rules)
	d.k.reach("after apply")
	return err
}

// TestUpdateKillPoints kills the agent at every point of a grow and of a
// shrink: the restarted agent's Recover holds the container's GPUs as the
// allocator has them, allowed exactly those, recorded so; Cleanup then
// leaves nothing.
func TestUpdateKillPoints(t *testing.T) {
	for _, tc := range []struct {
		name     string
		from, to int
	}{
		{"grow", 1, 3},
		{"shrink", 3, 1},
	} {
		points := chainUpdateKilled(t, tc.from, tc.to, 0)
		if len(points) == 0 {
			t.Fatalf("%s: no kill point", tc.name)
		}
		for at := 1; at <= len(points); at++ {
			t.Run(fmt.Sprintf("%s/killed at %s (%d)", tc.name, points[at-1], at), func(t *testing.T) {
				chainUpdateKilled(t, tc.from, tc.to, at)
			})
		}
	}
}

func chainUpdateKilled(t *testing.T, from, to, at int) []string {
	t.Helper()
	ctx := context.Background()
	f := newFixture(t)
	a, err := allocator.New(f.inv, allocator.WithStateDir(f.allocDir))
	if err != nil {
		t.Fatal(err)
	}
	k := &killPoints{at: at}
	first := newIsolator(Config{Allocator: a, Inventory: f.inv, StateDir: f.dir, Logger: slog.New(k)}, f.dir, parent, killingDevices{f.dev, k})
	if _, err := first.Prepare(ctx, "c1", allocator.Request{Count: from}, containerizer.Image{}); err != nil {
		t.Fatal(err)
	}
	if err := first.Isolate(ctx, "c1", 4242); err != nil {
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
		_, err := first.Update(ctx, "c1", to)
		killed = false
		done <- err
	}()
	if err := <-done; at == 0 && err != nil {
		t.Fatalf("update: %v", err)
	}
	a.Close()
	k.mu.Lock()
	points := slices.Clone(k.points)
	k.mu.Unlock()

	iso, a := f.open(t)
	res, err := iso.Recover(ctx, []string{"c1"})
	if err != nil || !slices.Equal(res.Recovered, []string{"c1"}) {
		t.Fatalf("recover after %v: %+v, %v", points, res, err)
	}
	al, err := a.Allocation("c1")
	if err != nil || (len(al.Devices) != from && len(al.Devices) != to) {
		t.Fatalf("after %v: holds %+v, %v", points, al, err)
	}
	key := parent + "/c1"
	for i, d := range f.inv.Devices {
		held := slices.ContainsFunc(al.Devices, func(g node.DeviceRef) bool { return g.UUID == d.UUID })
		if f.dev.allows(key, d.Ref()) != held {
			t.Errorf("after %v: GPU %d allowed %v, held %v", points, i, !held, held)
		}
	}
	rec, err := iso.read("c1")
	if err != nil || !slices.Equal(rec.GPUs, uuids(al.Devices)) {
		t.Errorf("after %v: record %+v, %v; holds %v", points, rec, err, uuids(al.Devices))
	}
	f.dev.mu.Lock()
	f.dev.procs[key] = nil // the container is gone
	f.dev.mu.Unlock()
	if err := iso.Cleanup(ctx, "c1"); err != nil {
		t.Fatal(err)
	}
	if len(a.Allocations()) != 0 {
		t.Errorf("left: %+v", a.Allocations())
	}
	if ids, _ := iso.ids(); len(ids) != 0 {
		t.Errorf("records left: %v", ids)
	}
	return points
}
