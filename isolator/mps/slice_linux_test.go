package mps_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/isolator/mps"
	"github.com/gpuiso/gpuiso/node"
)

// sliceOf is owner's allocation of 1 of n slices of g, a GPU of 16 GiB.
func sliceOf(owner string, g node.DeviceRef, n int) allocator.Allocation {
	return allocator.Allocation{Owner: owner, Devices: []node.DeviceRef{g},
		Share: &allocator.Share{Mode: allocator.ShareSlice, Slices: n, MemoryBytes: 16 * gib / uint64(n)}}
}

// TestSliceDaemon: the slices of one GPU share one daemon (the real
// control binary), started with the first, whose default limits are 1/N
// of the GPU, read back from it; it runs while any slice is held and
// stops, its directory gone, with the last.
func TestSliceDaemon(t *testing.T) {
	m, _ := newManager(t)
	ctx := context.Background()
	g := gpu(0)
	a, err := m.StartShare(ctx, sliceOf("a", g, 4))
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.StartShare(ctx, sliceOf("b", g, 4))
	if err != nil {
		t.Fatal(err)
	}
	if a.Pid == 0 || a.Pid != b.Pid || a.PipeDir != b.PipeDir || a.ShmDir != b.ShmDir || a.Owner != mps.SliceOwner(g.UUID) || a.Slices != 4 {
		t.Fatalf("slices a and b got daemons %+v and %+v, want one of %s", a, b, mps.SliceOwner(g.UUID))
	}
	if want := (mps.Limits{MemoryBytes: 4 * gib, ComputePercent: 25}); a.Limits != want {
		t.Fatalf("limits %+v, want %+v", a.Limits, want)
	}
	held, err := m.Held(ctx, a.Owner)
	if err != nil {
		t.Fatal(err)
	}
	if held.ComputePercent != 25 || !held.MemorySet || held.MemoryMinMiB > 4096 || held.MemoryMaxMiB < 4096 {
		t.Fatalf("the daemon holds %+v, want 4096 MiB and 25%%", held)
	}
	env := a.Limits.Env()
	if !slices.Contains(env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25") || !slices.Contains(env, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M") {
		t.Fatalf("env %v", env)
	}
	if ds, _ := m.List(ctx); len(ds) != 1 {
		t.Fatalf("%d daemons, want 1: %+v", len(ds), ds)
	}
	// Again for a: idempotent, the same daemon.
	if again, err := m.StartShare(ctx, sliceOf("a", g, 4)); err != nil || again.Pid != a.Pid {
		t.Fatalf("again: %+v, %v", again, err)
	}
	// A slice of another count beside them: the GPU's daemon has other limits.
	if _, err := m.StartShare(ctx, sliceOf("c", g, 2)); !errors.Is(err, mps.ErrExists) {
		t.Fatalf("a slice of 2 beside slices of 4: %v, want ErrExists", err)
	}
	if err := m.Stop(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if ds, _ := m.List(ctx); len(ds) != 1 || !ds[0].Alive || ds[0].Pid != a.Pid {
		t.Fatalf("after the first slice's stop: %+v, want the daemon running", ds)
	}
	if err := m.Stop(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if ds, _ := m.List(ctx); len(ds) != 0 {
		t.Fatalf("after the last slice's stop: %+v, want none", ds)
	}
	if _, err := os.Lstat(a.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("daemon directory %s: %v, want gone", a.Dir, err)
	}
	if alive(a.Pid) {
		t.Fatalf("daemon %d runs on", a.Pid)
	}
}

// alive reports whether pid runs (and is not a zombie).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	_, rest, _ := strings.Cut(string(b), ") ")
	return !strings.HasPrefix(rest, "Z") && !strings.HasPrefix(rest, "X")
}

// TestSliceConcurrentStarts: slices of one GPU started at once, from
// managers of one directory, start one daemon.
func TestSliceConcurrentStarts(t *testing.T) {
	m, dir := newManager(t)
	ctx := context.Background()
	g := gpu(0)
	const n = 6
	pids := make([]int, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mm := m
			if i%2 == 1 { // another manager of the directory, as another process has
				other, err := mps.New(dir)
				if err != nil {
					errs[i] = err
					return
				}
				defer other.Close()
				mm = other
			}
			d, err := mm.StartShare(ctx, sliceOf(fmt.Sprintf("t%d", i), g, 8))
			if err == nil {
				pids[i] = d.Pid
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil || pids[i] != pids[0] {
			t.Fatalf("slice %d: daemon %d (%v), want %d", i, pids[i], errs[i], pids[0])
		}
	}
	if ds, _ := m.List(ctx); len(ds) != 1 {
		t.Fatalf("%d daemons, want 1", len(ds))
	}
	for i := range n {
		if err := m.Stop(ctx, fmt.Sprintf("t%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if ds, _ := m.List(ctx); len(ds) != 0 {
		t.Fatalf("after every slice's stop: %+v", ds)
	}
}

// TestSliceSweep: a sweep keeps a slice daemon while an allocation holds
// a slice of its GPU or one of its tenants is kept, drops the tenants no
// one keeps, and stops it when nothing explains it.
func TestSliceSweep(t *testing.T) {
	m, _ := newManager(t)
	ctx := context.Background()
	g := gpu(0)
	a, b := sliceOf("a", g, 4), sliceOf("b", g, 4)
	d, err := m.StartShare(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.StartShare(ctx, b); err != nil {
		t.Fatal(err)
	}
	// Only b is held: a is dropped, the daemon kept.
	held := sliced{allocations{"b": b}, map[string][]allocator.Allocation{g.UUID: {b}}}
	if stopped, err := m.Sweep(ctx, mps.Keep{Shares: held}.Keeps); err != nil || len(stopped) != 0 {
		t.Fatalf("sweep with b held: stopped %v, %v", stopped, err)
	}
	// Stop of a, dropped already, leaves the daemon to b.
	if err := m.Stop(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if ds, _ := m.List(ctx); len(ds) != 1 || ds[0].Pid != d.Pid || !ds[0].Alive {
		t.Fatalf("after a's stop: %+v, want the daemon for b", ds)
	}
	// Kept by its name alone (a view that lists the GPU's slices).
	byName := sliced{allocations{}, map[string][]allocator.Allocation{g.UUID: {b}}}
	if stopped, err := m.Sweep(ctx, mps.Keep{Shares: byName}.Keeps); err != nil || len(stopped) != 0 {
		t.Fatalf("sweep with a slice of the GPU held: stopped %v, %v", stopped, err)
	}
	// Nothing holds a slice: the daemon goes.
	if stopped, err := m.Sweep(ctx, mps.Keep{Shares: sliced{allocations{}, nil}}.Keeps); err != nil || !slices.Equal(stopped, []string{d.Owner}) {
		t.Fatalf("sweep with nothing held: stopped %v, %v", stopped, err)
	}
	if alive(d.Pid) {
		t.Fatalf("daemon %d runs on", d.Pid)
	}
}

// TestSliceInvalidOwner: a slice whose owner is empty or breaks the
// owner-id rule is refused through every door (StartShare, StartSlice),
// ErrInvalid, and nothing is started or left.
func TestSliceInvalidOwner(t *testing.T) {
	ctx := context.Background()
	m, dir := newManager(t)
	g := gpu(0)
	for _, owner := range []string{"", "../x", "tasks"} {
		if d, err := m.StartShare(ctx, sliceOf(owner, g, 4)); d != nil || !errors.Is(err, mps.ErrInvalid) || !errors.Is(err, node.ErrInvalid) {
			t.Errorf("StartShare of %q's slice: %+v, %v; want ErrInvalid", owner, d, err)
		}
		s := *sliceOf(owner, g, 4).Share
		if _, err := m.StartSlice(ctx, owner, g, s); !errors.Is(err, mps.ErrInvalid) || !errors.Is(err, node.ErrInvalid) {
			t.Errorf("StartSlice of %q: %v; want ErrInvalid", owner, err)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 { // the lock file
		t.Fatalf("left in %s: %v", dir, entries)
	}
}
