package allocator_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/node"
)

// migShareNode is the simulated node with MIG devices: GPU 0 holds seven
// 1g.10gb devices (9984 MiB each), GPU 1 a 3g.40gb, a 2g.20gb and a
// 1g.10gb one.
const migShareNode = "hgx-h100-mig"

func migUUID(a *allocator.Allocator, gpu, i int) string {
	return a.Devices()[gpu].MIGDevices[i].UUID
}

// TestMIGMemoryShares: memory shares of MIG devices pack on one MIG device
// until its memory is spent, then open another; a MIG device holding
// shares is not handed out whole, nor shared by another mode, and is free
// whole again once its shares are released.
func TestMIGMemoryShares(t *testing.T) {
	ctx := context.Background()
	a := newAlloc(t, migShareNode)
	req := allocator.Request{MIG: "1g.10gb", Share: memShare(4 * gib)}
	first := allocOK(t, a, "s1", req)
	second := allocOK(t, a, "s2", req)
	if len(first.Devices) != 1 || !node.IsMIGUUID(first.Devices[0].UUID) || first.Share == nil || first.MemoryBytes != 4*gib {
		t.Fatalf("share of a MIG device: %+v", first)
	}
	mig := first.Devices[0].UUID
	if second.Devices[0].UUID != mig {
		t.Fatalf("second share on %s, want packed on %s", second.Devices[0].UUID, mig)
	}
	if third := allocOK(t, a, "s3", req); third.Devices[0].UUID == mig {
		t.Fatalf("a third 4 GiB share fits on a MIG device of 9984 MiB beside two")
	}
	if _, err := a.Allocate(ctx, "whole", allocator.Request{Devices: []string{mig}}); !errors.Is(err, allocator.ErrDeviceUnavailable) {
		t.Fatalf("a shared MIG device handed out whole: %v", err)
	}
	for _, d := range a.FreeMIG() {
		if d.UUID == mig {
			t.Fatal("a shared MIG device is listed free")
		}
	}
	if _, err := a.Allocate(ctx, "slice", allocator.Request{Devices: []string{mig}, Share: &allocator.Share{Mode: allocator.ShareSlice, Slices: 2}}); !errors.Is(err, allocator.ErrDeviceUnavailable) {
		t.Fatalf("a slice beside memory shares of a MIG device: %v", err)
	}
	if o, err := a.Owners(mig); err != nil || !slices.Equal(o, []string{"s1", "s2"}) {
		t.Fatalf("Owners(%s) = %v, %v", mig, o, err)
	}
	if sh, err := a.Shares(mig); err != nil || len(sh) != 2 || sh[0].Owner != "s1" || sh[1].Owner != "s2" {
		t.Fatalf("Shares(%s) = %+v, %v", mig, sh, err)
	}
	for _, o := range []string{"s1", "s2"} {
		if err := a.Release(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	allocOK(t, a, "whole", allocator.Request{Devices: []string{mig}})
	if _, err := a.Allocate(ctx, "s4", allocator.Request{Devices: []string{mig}, Share: memShare(gib)}); !errors.Is(err, allocator.ErrDeviceUnavailable) {
		t.Fatalf("a share of a MIG device held whole: %v", err)
	}
	if _, err := a.Allocate(ctx, "big", allocator.Request{MIG: "1g.10gb", Share: memShare(20 * gib)}); !errors.Is(err, allocator.ErrInvalidRequest) || !strings.Contains(err.Error(), "allocate a share of 20 GiB of a mig device for big") {
		t.Fatalf("a share larger than any MIG device of the profile: %v", err)
	}
}

// TestMIGSlices: a MIG device split in N concurrent slices holds at most N,
// each of its memory divided by N, and no slice of another count.
func TestMIGSlices(t *testing.T) {
	ctx := context.Background()
	a := newAlloc(t, migShareNode)
	mig := migUUID(a, 1, 0) // 3g.40gb
	slice := func(n int) allocator.Request {
		return allocator.Request{Devices: []string{mig}, Share: &allocator.Share{Mode: allocator.ShareSlice, Slices: n}}
	}
	want := a.Devices()[1].MIGDevices[0].MemoryBytes / 2
	for _, o := range []string{"a", "b"} {
		al := allocOK(t, a, o, slice(2))
		if al.Devices[0].UUID != mig || al.Share == nil || al.Share.MemoryBytes != want || al.Share.Slices != 2 {
			t.Fatalf("slice %s: %+v", o, al)
		}
	}
	if _, err := a.Allocate(ctx, "c", slice(2)); !errors.Is(err, allocator.ErrDeviceUnavailable) {
		t.Fatalf("a third slice of 2: %v", err)
	}
	if err := a.Release(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Allocate(ctx, "c", slice(4)); !errors.Is(err, allocator.ErrDeviceUnavailable) {
		t.Fatalf("a slice of 4 beside a slice of 2: %v", err)
	}
	allocOK(t, a, "c", slice(2))
	// Without a device named, slices pack onto the MIG device split in 2.
	if al := allocOK(t, a, "d", allocator.Request{MIG: "3g.40gb", Share: &allocator.Share{Mode: allocator.ShareSlice, Slices: 2}}); al.Devices[0].UUID == mig {
		t.Fatalf("a slice beyond the 2 of %s landed on it", mig)
	}
}

// TestMIGSharesPersist: shares of MIG devices are in the state file: a new
// allocator on the directory holds them (a claim re-holds each as it is,
// and refuses another share).
func TestMIGSharesPersist(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	a := newAlloc(t, migShareNode, allocator.WithStateDir(dir))
	mig := migUUID(a, 0, 2)
	mem := allocOK(t, a, "m", allocator.Request{Devices: []string{mig}, Share: &allocator.Share{MemoryBytes: 2 * gib, ComputePercent: 30}})
	other := migUUID(a, 1, 1)
	allocOK(t, a, "s", allocator.Request{Devices: []string{other}, Share: &allocator.Share{Mode: allocator.ShareSlice, Slices: 3}})
	a.Close()

	b := newAlloc(t, migShareNode, allocator.WithStateDir(dir))
	defer b.Close()
	if err := allocator.CheckInvariants(b); err != nil {
		t.Fatal(err)
	}
	got, err := b.Allocation("m")
	if err != nil || got.Devices[0].UUID != mig || got.Share == nil || *got.Share != *mem.Share {
		t.Fatalf("after a restart: %+v, %v; want %+v", got, err, mem)
	}
	if sh, err := b.Shares(other); err != nil || len(sh) != 1 || sh[0].Share.Slices != 3 {
		t.Fatalf("Shares(%s) after a restart = %+v, %v", other, sh, err)
	}
	again, err := b.Claim(ctx, "m", []node.DeviceRef{{UUID: mig}}, allocator.AsShare(*mem.Share))
	if err != nil || again.Devices[0].UUID != mig {
		t.Fatalf("claim of the held share: %+v, %v", again, err)
	}
	var ce *allocator.ClaimError
	if _, err := b.Claim(ctx, "m", []node.DeviceRef{{UUID: mig}}, allocator.AsShare(allocator.Share{MemoryBytes: gib})); !errors.As(err, &ce) {
		t.Fatalf("claim of another share: %v", err)
	}
	if al, err := b.Claim(ctx, "new", []node.DeviceRef{{UUID: mig}}, allocator.AsShare(allocator.Share{MemoryBytes: gib})); err != nil || al.MemoryBytes != gib {
		t.Fatalf("claim of a new share beside one: %+v, %v", al, err)
	}
	if _, err := b.Claim(ctx, "x", []node.DeviceRef{{UUID: other}}, allocator.AsShare(allocator.Share{MemoryBytes: gib})); !errors.Is(err, allocator.ErrDeviceUnavailable) {
		t.Fatalf("claim of a memory share beside slices: %v", err)
	}
	if err := allocator.CheckInvariants(b); err != nil {
		t.Fatal(err)
	}
}

// TestMIGReload: an allocator that reads the state again after another
// changed it forgets what its MIG devices held before: a MIG device it
// held whole, which another allocator released, takes a share, and the
// MIG device another allocator shared is as the file says.
func TestMIGReload(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	a := newAlloc(t, migShareNode, allocator.WithStateDir(dir))
	defer a.Close()
	b := newAlloc(t, migShareNode, allocator.WithStateDir(dir))
	defer b.Close()
	mig := migUUID(a, 0, 0)
	allocOK(t, a, "whole", allocator.Request{Devices: []string{mig}})
	allocOK(t, b, "shared", allocator.Request{Devices: []string{migUUID(a, 0, 1)}, Share: memShare(gib)})
	if err := b.Release(ctx, "whole"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Allocate(ctx, "again", allocator.Request{Devices: []string{mig}, Share: memShare(gib)}); err != nil {
		t.Fatalf("after another allocator released it: %v", err)
	}
	if sh, err := a.Shares(migUUID(a, 0, 1)); err != nil || len(sh) != 1 {
		t.Fatalf("the other allocator's share: %+v, %v", sh, err)
	}
}

// TestMIGAllocateSeesOthers: a MIG request takes the state directory's
// lock and reads the state another allocator wrote: a MIG device the other
// holds is not handed out again, and its owner is known.
func TestMIGAllocateSeesOthers(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	a := newAlloc(t, migShareNode, allocator.WithStateDir(dir))
	defer a.Close()
	b := newAlloc(t, migShareNode, allocator.WithStateDir(dir))
	defer b.Close()
	mig := migUUID(a, 1, 0)
	allocOK(t, a, "x", allocator.Request{Devices: []string{mig}})
	if _, err := b.Allocate(ctx, "y", allocator.Request{Devices: []string{mig}}); !errors.Is(err, allocator.ErrDeviceUnavailable) {
		t.Fatalf("a MIG device another allocator holds: %v", err)
	}
	if o, err := b.Owners(mig); err != nil || !slices.Equal(o, []string{"x"}) {
		t.Fatalf("Owners(%s) = %v, %v", mig, o, err)
	}
}
