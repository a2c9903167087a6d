package allocator_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/node"
)

func TestMarkUnhealthyHealthy(t *testing.T) {
	ctx := context.Background()
	a := newAlloc(t, "dgx1-volta")
	allocOK(t, a, "job", allocator.Request{Devices: []string{"2", "3"}})
	owners, err := a.MarkUnhealthy(ctx, "3", "XID 48")
	if err != nil || !slices.Equal(owners, []string{"job"}) {
		t.Fatalf("owners %v, err %v", owners, err)
	}
	if owners, err := a.MarkUnhealthy(ctx, "0", "test"); err != nil || len(owners) != 0 {
		t.Fatalf("free GPU: owners %v, err %v", owners, err)
	}
	if h := a.Devices()[3].Health; h.Healthy || h.Reason != "XID 48" {
		t.Fatalf("health %v", h)
	}
	// The owner keeps its GPU; it is not handed out after release.
	if err := a.Release(ctx, "job"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Allocate(ctx, "x", allocator.Request{Devices: []string{"3"}}); !errors.Is(err, allocator.ErrDeviceUnavailable) {
		t.Fatalf("unhealthy GPU handed out: %v", err)
	}
	if _, err := a.Allocate(ctx, "x", allocator.Request{Count: 7}); !errors.Is(err, node.ErrInsufficient) {
		t.Fatalf("7 of 6 healthy: %v", err)
	}
	if err := a.MarkHealthy(ctx, "3"); err != nil {
		t.Fatal(err)
	}
	if err := a.MarkHealthy(ctx, "GPU-none"); !errors.Is(err, allocator.ErrUnknownDevice) {
		t.Fatal(err)
	}
	allocOK(t, a, "x", allocator.Request{Count: 7})
}
