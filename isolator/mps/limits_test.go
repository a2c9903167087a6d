package mps_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/isolator/mps"
	"github.com/gpuiso/gpuiso/node"
)

// TestLimitsOf: a memory share's limits are derived and checked in one
// place; anything but a memory share of at least 1 MiB with a compute
// percentage from 0 to 100 is ErrInvalid, and the limits come back as the
// share has them all the same.
func TestLimitsOf(t *testing.T) {
	for _, tc := range []struct {
		name  string
		share allocator.Share
		ok    bool
	}{
		{"memory", allocator.Share{Mode: allocator.ShareMemory, MemoryBytes: 4 << 30, ComputePercent: 50}, true},
		{"memory, mode left empty", allocator.Share{MemoryBytes: 1 << 20}, true},
		{"no compute limit", allocator.Share{MemoryBytes: 1 << 30}, true},
		{"all the compute", allocator.Share{MemoryBytes: 1 << 30, ComputePercent: 100}, true},
		{"time slice", allocator.Share{Mode: allocator.ShareTime}, false},
		{"no memory", allocator.Share{Mode: allocator.ShareMemory}, false},
		{"under 1 MiB", allocator.Share{MemoryBytes: 1<<20 - 1}, false},
		{"compute over 100", allocator.Share{MemoryBytes: 1 << 30, ComputePercent: 101}, false},
		{"negative compute", allocator.Share{MemoryBytes: 1 << 30, ComputePercent: -1}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := mps.LimitsOf(tc.share)
			if l.MemoryBytes != tc.share.MemoryBytes || l.ComputePercent != tc.share.ComputePercent {
				t.Errorf("limits %+v of %+v", l, tc.share)
			}
			if tc.ok != (err == nil) || (err != nil && (!errors.Is(err, mps.ErrInvalid) || !errors.Is(err, node.ErrInvalid))) {
				t.Errorf("LimitsOf(%+v) = %v, want ok %v (else ErrInvalid)", tc.share, err, tc.ok)
			}
		})
	}
}

// TestLimitsEnv pins the client limits a share's container carries: the
// memory in whole MiB as the daemon holds it (at least 1), and the compute
// percentage only when there is one.
func TestLimitsEnv(t *testing.T) {
	for _, tc := range []struct {
		lim  mps.Limits
		want []string
	}{
		{mps.Limits{MemoryBytes: 4 << 30, ComputePercent: 50}, []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M"}},
		{mps.Limits{MemoryBytes: 3<<20 + 5}, []string{"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=3M"}},
		{mps.Limits{MemoryBytes: 100}, []string{"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=1M"}},
	} {
		if got := tc.lim.Env(); !slices.Equal(got, tc.want) {
			t.Errorf("%+v: env %q, want %q", tc.lim, got, tc.want)
		}
	}
}

// TestStartShareWithoutManager: only a memory share needs a daemon; with
// no manager it is ErrNoManager (not supported), and whole GPUs, MIG
// devices and time slices need nothing.
func TestStartShareWithoutManager(t *testing.T) {
	var m *mps.Manager
	gpu := node.DeviceRef{Index: 0, UUID: "GPU-5d1a1c8e-0000-0000-0000-000000000000"}
	for _, al := range []allocator.Allocation{
		{Owner: "whole", Devices: []node.DeviceRef{gpu}},
		{Owner: "slice", Devices: []node.DeviceRef{gpu}, Share: &allocator.Share{Mode: allocator.ShareTime}},
	} {
		if d, err := m.StartShare(context.Background(), al); d != nil || err != nil {
			t.Errorf("%s: daemon %+v, %v; want none", al.Owner, d, err)
		}
	}
	al := allocator.Allocation{Owner: "mem", Devices: []node.DeviceRef{gpu}, Share: &allocator.Share{Mode: allocator.ShareMemory, MemoryBytes: 1 << 30}}
	if d, err := m.StartShare(context.Background(), al); d != nil || !errors.Is(err, mps.ErrNoManager) || !errors.Is(err, node.ErrNotSupported) {
		t.Fatalf("memory share without a manager: %+v, %v", d, err)
	}
}
