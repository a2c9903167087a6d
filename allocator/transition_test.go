package allocator_test

import (
	"context"
	"errors"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
)

// deviceState is the life cycle state of one GPU in the allocator.
type deviceState string

const (
	stFree            deviceState = "free"
	stOwned           deviceState = "owned"
	stShared          deviceState = "shared"
	stUnhealthyFree   deviceState = "unhealthy-free"
	stUnhealthyOwned  deviceState = "unhealthy-owned"
	stUnhealthyShared deviceState = "unhealthy-shared"
)

// TestDeviceTransitions runs every event in every state of a shareable GPU
// and checks the state it ends in, or the error and that nothing changed.
func TestDeviceTransitions(t *testing.T) {
	ctx := context.Background()
	enter := map[deviceState]func(*allocator.Allocator) error{
		stFree: func(*allocator.Allocator) error { return nil },
		stOwned: func(a *allocator.Allocator) error {
			_, err := a.Allocate(ctx, "holder", allocator.Request{Devices: []string{"0"}})
			return err
		},
		stShared: func(a *allocator.Allocator) error {
			_, err := a.Allocate(ctx, "holder", allocator.Request{Devices: []string{"0"}, MemoryBytes: 1 << 30})
			return err
		},
	}
	for _, base := range []deviceState{stFree, stOwned, stShared} {
		base := base
		enter["unhealthy-"+base] = func(a *allocator.Allocator) error {
			if err := enter[base](a); err != nil {
				return err
			}
			_, err := a.MarkUnhealthy(ctx, "0", "test")
			return err
		}
	}
	events := map[string]func(*allocator.Allocator) error{
		"allocate whole": func(a *allocator.Allocator) error {
			_, err := a.Allocate(ctx, "new", allocator.Request{Devices: []string{"0"}})
			return err
		},
		"allocate share": func(a *allocator.Allocator) error {
			_, err := a.Allocate(ctx, "new", allocator.Request{Devices: []string{"0"}, MemoryBytes: 1 << 30})
			return err
		},
		"release holder": func(a *allocator.Allocator) error { return a.Release(ctx, "holder") },
		"mark unhealthy": func(a *allocator.Allocator) error { _, err := a.MarkUnhealthy(ctx, "0", "test"); return err },
		"mark healthy":   func(a *allocator.Allocator) error { return a.MarkHealthy(ctx, "0") },
	}
	type outcome struct {
		next deviceState
		err  error
	}
	unavailable := allocator.ErrDeviceUnavailable
	matrix := map[deviceState]map[string]outcome{
		stFree: {
			"allocate whole": {stOwned, nil}, "allocate share": {stShared, nil}, "release holder": {stFree, allocator.ErrUnknownOwner},
			"mark unhealthy": {stUnhealthyFree, nil}, "mark healthy": {stFree, nil},
		},
		stOwned: {
			"allocate whole": {stOwned, unavailable}, "allocate share": {stOwned, unavailable}, "release holder": {stFree, nil},
			"mark unhealthy": {stUnhealthyOwned, nil}, "mark healthy": {stOwned, nil},
		},
		stShared: {
			"allocate whole": {stShared, unavailable}, "allocate share": {stShared, nil}, "release holder": {stFree, nil},
			"mark unhealthy": {stUnhealthyShared, nil}, "mark healthy": {stShared, nil},
		},
		stUnhealthyFree: {
			"allocate whole": {stUnhealthyFree, unavailable}, "allocate share": {stUnhealthyFree, unavailable},
			"release holder": {stUnhealthyFree, allocator.ErrUnknownOwner}, "mark unhealthy": {stUnhealthyFree, nil}, "mark healthy": {stFree, nil},
		},
		stUnhealthyOwned: {
			"allocate whole": {stUnhealthyOwned, unavailable}, "allocate share": {stUnhealthyOwned, unavailable},
			"release holder": {stUnhealthyFree, nil}, "mark unhealthy": {stUnhealthyOwned, nil}, "mark healthy": {stOwned, nil},
		},
		stUnhealthyShared: {
			"allocate whole": {stUnhealthyShared, unavailable}, "allocate share": {stUnhealthyShared, unavailable},
			"release holder": {stUnhealthyFree, nil}, "mark unhealthy": {stUnhealthyShared, nil}, "mark healthy": {stShared, nil},
		},
	}
	for from, row := range matrix {
		for ev, want := range row {
			t.Run(string(from)+"/"+ev, func(t *testing.T) {
				a := newAlloc(t, "rtx8000x4", allocator.WithShared("0"))
				if err := enter[from](a); err != nil {
					t.Fatal(err)
				}
				if got := deviceStateOf(t, a); got != from {
					t.Fatalf("set-up reached %s", got)
				}
				before := a.Allocations()
				err := events[ev](a)
				if !errors.Is(err, want.err) || (want.err == nil) != (err == nil) {
					t.Fatalf("err = %v, want %v", err, want.err)
				}
				if got := deviceStateOf(t, a); got != want.next {
					t.Fatalf("state %s, want %s", got, want.next)
				}
				if err != nil && !equalAllocations(a.Allocations(), before) {
					t.Fatal("failed event changed the allocations")
				}
				if err := allocator.CheckInvariants(a); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
	if len(matrix) != len(enter) {
		t.Fatalf("matrix covers %d of %d states", len(matrix), len(enter))
	}
}

func deviceStateOf(t *testing.T, a *allocator.Allocator) deviceState {
	t.Helper()
	healthy := a.Devices()[0].Health.Healthy
	owners, err := a.Owners("0")
	if err != nil {
		t.Fatal(err)
	}
	var s deviceState = stFree
	if len(owners) > 0 {
		al, err := a.Allocation(owners[0])
		if err != nil {
			t.Fatal(err)
		}
		s = stOwned
		if al.Shared {
			s = stShared
		}
	}
	if !healthy {
		s = "unhealthy-" + s
	}
	return s
}
