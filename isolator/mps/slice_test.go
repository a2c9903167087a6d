package mps_test

import (
	"errors"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/isolator/mps"
)

// TestSliceLimits: a concurrent slice's limits are 1/N of its GPU: the
// memory the allocation gives it and the compute rounded down to a whole
// percentage; a malformed slice is ErrInvalid.
func TestSliceLimits(t *testing.T) {
	for _, tc := range []struct {
		s    allocator.Share
		want mps.Limits
		ok   bool
	}{
		{allocator.Share{Mode: allocator.ShareSlice, Slices: 4, MemoryBytes: 4 << 30}, mps.Limits{MemoryBytes: 4 << 30, ComputePercent: 25}, true},
		{allocator.Share{Mode: allocator.ShareSlice, Slices: 3, MemoryBytes: 1 << 30}, mps.Limits{MemoryBytes: 1 << 30, ComputePercent: 33}, true},
		{allocator.Share{Mode: allocator.ShareSlice, Slices: 48, MemoryBytes: 1 << 30}, mps.Limits{MemoryBytes: 1 << 30, ComputePercent: 2}, true},
		{allocator.Share{Mode: allocator.ShareSlice, Slices: 1, MemoryBytes: 1 << 30}, mps.Limits{}, false},
		{allocator.Share{Mode: allocator.ShareSlice, Slices: 49, MemoryBytes: 1 << 30}, mps.Limits{}, false},
		{allocator.Share{Mode: allocator.ShareSlice, Slices: 4}, mps.Limits{}, false},
		{allocator.Share{Mode: allocator.ShareSlice, Slices: 4, MemoryBytes: 1 << 30, ComputePercent: 50}, mps.Limits{}, false},
	} {
		got, err := mps.LimitsOf(tc.s)
		if tc.ok != (err == nil) || err != nil && !errors.Is(err, mps.ErrInvalid) {
			t.Errorf("LimitsOf(%+v) = %v, want ok %v", tc.s, err, tc.ok)
		}
		if tc.ok && got != tc.want {
			t.Errorf("LimitsOf(%+v) = %+v, want %+v", tc.s, got, tc.want)
		}
	}
}

// sliced is an allocator's view for Keep that also lists a GPU's shares,
// as allocator.Allocator.Shares does.
type sliced struct {
	allocations
	byGPU map[string][]allocator.Allocation
}

func (s sliced) Shares(device string) ([]allocator.Allocation, error) {
	return s.byGPU[device], nil
}

// TestKeepSlices: a slice daemon (SliceOwner) is explained while an
// allocation holds a slice of its GPU, and a slice's owner as a memory
// share's is; a GPU held by a memory share explains no slice daemon.
func TestKeepSlices(t *testing.T) {
	const g0, g1 = "GPU-0", "GPU-1"
	sl := allocator.Allocation{Owner: "a", Share: &allocator.Share{Mode: allocator.ShareSlice, Slices: 4, MemoryBytes: 1 << 30}}
	mem := allocator.Allocation{Owner: "m", Share: &allocator.Share{Mode: allocator.ShareMemory, MemoryBytes: 1 << 30}}
	k := mps.Keep{Shares: sliced{allocations{"a": sl, "m": mem}, map[string][]allocator.Allocation{g0: {sl}, g1: {mem}}}}
	for owner, want := range map[string]bool{"a": true, "m": true, mps.SliceOwner(g0): true, mps.SliceOwner(g1): false, mps.SliceOwner("GPU-2"): false} {
		if got := k.Keeps(owner); got != want {
			t.Errorf("Keeps(%s) = %v, want %v", owner, got, want)
		}
	}
	// An allocator view without Shares explains no slice daemon.
	if (mps.Keep{Shares: allocations{"a": sl}}).Keeps(mps.SliceOwner(g0)) {
		t.Error("a slice daemon kept by a view that cannot list a GPU's shares")
	}
	if uuid, ok := mps.IsSliceOwner(mps.SliceOwner(g0)); !ok || uuid != g0 {
		t.Errorf("IsSliceOwner = %q, %v", uuid, ok)
	}
	if _, ok := mps.IsSliceOwner("slices-"); ok {
		t.Error("IsSliceOwner of no uuid")
	}
}
