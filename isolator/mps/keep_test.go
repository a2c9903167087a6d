package mps_test

import (
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/isolator/mps"
)

// allocations is an allocator's view for Keep: what each owner holds.
type allocations map[string]allocator.Allocation

func (a allocations) Allocation(owner string) (allocator.Allocation, error) {
	al, ok := a[owner]
	if !ok {
		return allocator.Allocation{}, allocator.ErrUnknownOwner
	}
	return al, nil
}

// TestKeep: a sweep keeps the daemon of an owner that holds a memory share
// or that the caller's records name, and no other: not a time slice's, not
// whole GPUs', not an unknown owner's.
func TestKeep(t *testing.T) {
	shares := allocations{
		"mem":   {Owner: "mem", Share: &allocator.Share{Mode: allocator.ShareMemory, MemoryBytes: 1 << 30}},
		"slice": {Owner: "slice", Share: &allocator.Share{Mode: allocator.ShareTime}},
		"whole": {Owner: "whole"},
	}
	recorded := func(owner string) bool { return owner == "rec" }
	for _, tc := range []struct {
		name string
		keep mps.Keep
		want map[string]bool
	}{
		{"shares and records", mps.Keep{Shares: shares, Recorded: recorded}, map[string]bool{"mem": true, "rec": true}},
		{"shares alone", mps.Keep{Shares: shares}, map[string]bool{"mem": true}},
		{"records alone", mps.Keep{Recorded: recorded}, map[string]bool{"rec": true}},
		{"nothing", mps.Keep{}, map[string]bool{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, owner := range []string{"mem", "slice", "whole", "rec", "stranger"} {
				if got := tc.keep.Keeps(owner); got != tc.want[owner] {
					t.Errorf("Keeps(%s) = %v, want %v", owner, got, tc.want[owner])
				}
			}
		})
	}
}
