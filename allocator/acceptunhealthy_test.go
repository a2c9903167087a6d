package allocator_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
)

// TestAcceptUnhealthy: a request hands out an unhealthy GPU, MIG device or
// share of a GPU only when it names it in AcceptUnhealthy; the devices it
// does not name, those the allocator chooses, and devices held by another
// owner are refused as without it.
func TestAcceptUnhealthy(t *testing.T) {
	ctx := context.Background()
	a := newAlloc(t, "dgx1-volta")
	for _, d := range []string{"3", "4"} {
		if _, err := a.MarkUnhealthy(ctx, d, "XID 79"); err != nil {
			t.Fatal(err)
		}
	}
	for name, r := range map[string]allocator.Request{
		"not accepted":        {Devices: []string{"3"}},
		"another accepted":    {Devices: []string{"3", "4"}, AcceptUnhealthy: []string{"4"}},
		"chosen, not named":   {Count: 8, Devices: []string{"3"}, AcceptUnhealthy: []string{"3"}},
		"share, not accepted": {Devices: []string{"3"}, MemoryBytes: 1 << 30},
	} {
		if _, err := a.Allocate(ctx, "x", r); err == nil {
			t.Errorf("%s: an unhealthy GPU handed out for %+v", name, r)
			a.Release(ctx, "x")
		}
	}
	if _, err := a.Allocate(ctx, "x", allocator.Request{Devices: []string{"2"}, AcceptUnhealthy: []string{"3"}}); !errors.Is(err, allocator.ErrInvalidRequest) {
		t.Errorf("accepting a device the request does not name: %v, want ErrInvalidRequest", err)
	}
	al := allocOK(t, a, "diag", allocator.Request{Devices: []string{"3", "5"}, AcceptUnhealthy: []string{"3"}})
	if got := allocIndexes(al); !slices.Equal(got, []int{3, 5}) {
		t.Fatalf("diagnostic got GPUs %v, want [3 5]", got)
	}
	if _, err := a.Allocate(ctx, "y", allocator.Request{Devices: []string{"3"}, AcceptUnhealthy: []string{"3"}}); !errors.Is(err, allocator.ErrDeviceUnavailable) {
		t.Errorf("an unhealthy GPU held by another owner: %v, want ErrDeviceUnavailable", err)
	}
	if h := a.Devices()[3].Health; h.Healthy {
		t.Error("accepting GPU 3 made it healthy")
	}
	if err := a.Release(ctx, "diag"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Allocate(ctx, "x", allocator.Request{Count: 7}); !errors.Is(err, allocator.ErrInsufficient) {
		t.Errorf("7 GPUs of 6 healthy after the diagnostic: %v", err)
	}

	s := newAlloc(t, "dgx1-volta", allocator.WithShared("3"))
	if _, err := s.MarkUnhealthy(ctx, "3", "XID 94"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Allocate(ctx, "x", allocator.Request{Devices: []string{"3"}, MemoryBytes: 1 << 30}); !errors.Is(err, allocator.ErrDeviceUnavailable) {
		t.Errorf("a share of an unhealthy GPU: %v, want ErrDeviceUnavailable", err)
	}
	allocOK(t, s, "diag", allocator.Request{Devices: []string{"3"}, MemoryBytes: 1 << 30, AcceptUnhealthy: []string{"3"}})

	m := newAlloc(t, "hgx-h100-mig")
	mig := m.Devices()[2].MIGDevices
	if _, err := m.MarkUnhealthy(ctx, mig[0].UUID, "XID 48"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Allocate(ctx, "x", allocator.Request{Devices: []string{mig[0].UUID}}); !errors.Is(err, allocator.ErrDeviceUnavailable) {
		t.Errorf("an unhealthy MIG device: %v, want ErrDeviceUnavailable", err)
	}
	if _, err := m.Allocate(ctx, "x", allocator.Request{Devices: []string{mig[1].UUID}, AcceptUnhealthy: []string{mig[0].UUID}}); !errors.Is(err, allocator.ErrInvalidRequest) {
		t.Errorf("accepting a MIG device the request does not name: %v, want ErrInvalidRequest", err)
	}
	al = allocOK(t, m, "diag", allocator.Request{Devices: []string{mig[0].UUID}, AcceptUnhealthy: []string{mig[0].UUID}})
	if al.Devices[0].UUID != mig[0].UUID {
		t.Errorf("diagnostic got %s, want %s", al.Devices[0].UUID, mig[0].UUID)
	}
}
