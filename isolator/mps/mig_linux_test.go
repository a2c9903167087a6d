package mps_test

import (
	"context"
	"os"
	"slices"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/isolator/mps"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
)

// migInventory is the simulated node with MIG devices (hgx-h100-mig).
func migInventory(t *testing.T) *node.Inventory {
	t.Helper()
	sim, err := simnode.New("hgx-h100-mig")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	inv, err := nvmlnode.Discover(context.Background(), nvmlnode.WithNVML(sim.NVML()),
		nvmlnode.WithDevRoot(dir), nvmlnode.WithProcRoot(dir), nvmlnode.WithSysRoot(dir))
	if err != nil {
		t.Fatal(err)
	}
	return inv
}

// TestMIGShareDaemons: the allocator's shares of MIG devices get daemons
// that serve their MIG device alone (CUDA_VISIBLE_DEVICES its "MIG-"
// UUID): a memory share's own daemon holds the share's limits, and the
// slices of a MIG device share one daemon (SliceOwner of the MIG UUID)
// whose limits are 1/N of the MIG device's memory and threads, kept by a
// sweep while the allocator holds a slice of it and stopped with the last.
func TestMIGShareDaemons(t *testing.T) {
	testenv.RequireSimulatedMPS(t)
	ctx := context.Background()
	m, _ := newManager(t)
	a, err := allocator.New(migInventory(t))
	if err != nil {
		t.Fatal(err)
	}
	mem, err := a.Allocate(ctx, "mem", allocator.Request{MIG: "1g.10gb", Share: &allocator.Share{MemoryBytes: 2 * gib, ComputePercent: 40}})
	if err != nil {
		t.Fatal(err)
	}
	mig := mem.Devices[0].UUID
	d, err := m.StartShare(ctx, mem)
	if err != nil {
		t.Fatal(err)
	}
	if d.GPU != mig || d.Limits != (mps.Limits{MemoryBytes: 2 * gib, ComputePercent: 40}) {
		t.Fatalf("memory share's daemon %+v, want %s with 2 GiB, 40%%", d, mig)
	}
	if env := environ(t, d.Pid); !slices.Contains(env, "CUDA_VISIBLE_DEVICES="+mig) {
		t.Fatalf("daemon environment %v, want CUDA_VISIBLE_DEVICES=%s", env, mig)
	}
	held, err := m.Held(ctx, "mem")
	if err != nil || held.ComputePercent != 40 || !held.MemorySet || held.MemoryMinMiB > 2048 || held.MemoryMaxMiB < 2048 {
		t.Fatalf("the daemon holds %+v (%v), want 2048 MiB and 40%%", held, err)
	}

	big := a.Devices()[1].MIGDevices[0] // 3g.40gb
	var sl []allocator.Allocation
	for _, o := range []string{"s1", "s2"} {
		al, err := a.Allocate(ctx, o, allocator.Request{Devices: []string{big.UUID}, Share: &allocator.Share{Mode: allocator.ShareSlice, Slices: 2}})
		if err != nil {
			t.Fatal(err)
		}
		sl = append(sl, al)
	}
	s1, err := m.StartShare(ctx, sl[0])
	if err != nil {
		t.Fatal(err)
	}
	s2, err := m.StartShare(ctx, sl[1])
	if err != nil {
		t.Fatal(err)
	}
	want := mps.Limits{MemoryBytes: big.MemoryBytes / 2 >> 20 << 20, ComputePercent: 50}
	if s1.Pid != s2.Pid || s1.Owner != mps.SliceOwner(big.UUID) || s1.GPU != big.UUID || s1.Limits != want {
		t.Fatalf("slice daemons %+v and %+v, want one of %s with %+v", s1, s2, big.UUID, want)
	}
	if env := environ(t, s1.Pid); !slices.Contains(env, "CUDA_VISIBLE_DEVICES="+big.UUID) {
		t.Fatalf("slice daemon environment %v, want CUDA_VISIBLE_DEVICES=%s", env, big.UUID)
	}

	// A sweep keeps what the allocator holds: both daemons.
	if stopped, err := m.Sweep(ctx, mps.Keep{Shares: a}.Keeps); err != nil || len(stopped) != 0 {
		t.Fatalf("sweep with every share held stopped %v, %v", stopped, err)
	}
	if err := a.Release(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	if err := m.Stop(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	if stopped, err := m.Sweep(ctx, mps.Keep{Shares: a}.Keeps); err != nil || len(stopped) != 0 {
		t.Fatalf("sweep with one slice held stopped %v, %v", stopped, err)
	}
	if err := a.Release(ctx, "s2"); err != nil {
		t.Fatal(err)
	}
	if stopped, err := m.Sweep(ctx, mps.Keep{Shares: a}.Keeps); err != nil || !slices.Equal(stopped, []string{mps.SliceOwner(big.UUID)}) {
		t.Fatalf("sweep with no slice held stopped %v, %v, want the slice daemon", stopped, err)
	}
	if err := m.Stop(ctx, "mem"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(d.Dir); !os.IsNotExist(err) {
		t.Fatalf("daemon directory %s: %v, want gone", d.Dir, err)
	}
}
