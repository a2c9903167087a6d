package chain

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/isolator/mps"
)

// TestSlices: two concurrent slices prepared by the chain share their
// GPU's one MPS daemon, whose directories both launches get; Recover after
// a lost allocator state holds both slices again and keeps the daemon;
// Cleanup of the first leaves it to the second, Cleanup of the second
// stops it.
func TestSlices(t *testing.T) {
	testenv.RequireSimulatedMPS(t)
	ctx := context.Background()
	f := newFixture(t)
	m, err := mps.New(filepath.Join(t.TempDir(), "mps"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		m.Sweep(ctx, nil)
		m.Close()
	}()
	open := func() (*Isolator, *allocator.Allocator) {
		a, err := allocator.New(f.inv, allocator.WithShared("0", "1"))
		if err != nil {
			t.Fatal(err)
		}
		return newIsolator(Config{Allocator: a, Inventory: f.inv, StateDir: f.dir, MPS: m}, f.dir, parent, f.dev), a
	}
	iso, _ := open()
	slice := allocator.Request{Share: &allocator.Share{Mode: allocator.ShareSlice, Slices: 4}}
	var pipes []string
	for _, id := range []string{"job-a", "job-b"} {
		l, err := iso.Prepare(ctx, id, slice, containerizer.Image{})
		if err != nil {
			t.Fatal(err)
		}
		if err := iso.Isolate(ctx, id, 100); err != nil {
			t.Fatal(err)
		}
		if l.Plan.MPS == nil {
			t.Fatalf("%s: no MPS daemon in the plan", id)
		}
		pipes = append(pipes, l.Plan.MPS.PipeDir)
	}
	ds, _ := m.List(ctx)
	if len(ds) != 1 || !ds[0].Alive || ds[0].Slices != 4 || pipes[0] != ds[0].PipeDir || pipes[1] != ds[0].PipeDir {
		t.Fatalf("daemons %+v, pipe directories %v: want one daemon of both", ds, pipes)
	}
	d := ds[0]

	// A restarted agent, its allocator's state lost.
	iso2, a2 := open()
	res, err := iso2.Recover(ctx, []string{"job-a", "job-b"})
	if err != nil || len(res.Recovered) != 2 {
		t.Fatalf("Recover = %+v, %v", res, err)
	}
	for _, id := range []string{"job-a", "job-b"} {
		if al, err := a2.Allocation(id); err != nil || al.Share == nil || al.Share.Mode != allocator.ShareSlice || al.Share.Slices != 4 {
			t.Fatalf("allocation of %s after Recover: %+v, %v", id, al, err)
		}
	}
	if ds, _ := m.List(ctx); len(ds) != 1 || ds[0].Pid != d.Pid || !ds[0].Alive {
		t.Fatalf("daemons after Recover: %+v, want %d running", ds, d.Pid)
	}
	f.dev.procs = map[string][]int{} // the containers' processes ended
	if err := iso2.Cleanup(ctx, "job-a"); err != nil {
		t.Fatal(err)
	}
	if ds, _ := m.List(ctx); len(ds) != 1 || ds[0].Pid != d.Pid || !ds[0].Alive {
		t.Fatalf("daemons after the first Cleanup: %+v, want %d running", ds, d.Pid)
	}
	if err := iso2.Cleanup(ctx, "job-b"); err != nil {
		t.Fatal(err)
	}
	if ds, _ := m.List(ctx); len(ds) != 0 {
		t.Fatalf("daemons after the last Cleanup: %+v", ds)
	}
}
