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

// TestInform: a note on a healthy device shows with it and keeps it in
// service; an unhealthy device is left as it is; MarkHealthy takes the
// note off.
func TestInform(t *testing.T) {
	ctx := context.Background()
	a := newAlloc(t, "dgx1-volta")
	if err := a.Inform(ctx, "1", "XID 94 (contained ECC error): restart-app"); err != nil {
		t.Fatal(err)
	}
	if h := a.Devices()[1].Health; !h.Healthy || h.Reason != "XID 94 (contained ECC error): restart-app" {
		t.Fatalf("noted GPU: %+v", h)
	}
	if got := allocOK(t, a, "job", allocator.Request{Devices: []string{"1"}}); len(got.Devices) != 1 {
		t.Fatalf("a noted GPU not handed out: %+v", got)
	}
	if _, err := a.MarkUnhealthy(ctx, "2", "XID 79"); err != nil {
		t.Fatal(err)
	}
	if err := a.Inform(ctx, "2", "thermal-slowdown: none"); err != nil {
		t.Fatal(err)
	}
	if h := a.Devices()[2].Health; h.Healthy || h.Reason != "XID 79" {
		t.Fatalf("a note on an unhealthy GPU changed it: %+v", h)
	}
	if err := a.MarkHealthy(ctx, "1"); err != nil {
		t.Fatal(err)
	}
	if h := a.Devices()[1].Health; h != node.Healthy() {
		t.Fatalf("the note stayed: %+v", h)
	}
	if err := a.Inform(ctx, "1", " "); !errors.Is(err, node.ErrInvalid) {
		t.Errorf("an empty note: %v", err)
	}
	if err := a.Inform(ctx, "GPU-none", "x"); !errors.Is(err, allocator.ErrUnknownDevice) {
		t.Errorf("a note on no device: %v", err)
	}
}
