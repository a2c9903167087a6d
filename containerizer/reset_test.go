package containerizer_test

import (
	"context"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/node"
)

// TestStopForReset: the containers among the owners of a GPU waiting for
// its reset are destroyed and their GPUs given back; a container not
// among them and an owner that is no container are left alone.
func TestStopForReset(t *testing.T) {
	ctx := context.Background()
	_, alloc := simAllocator(t, "dgx1-volta")
	rt := newFakeRuntime()
	l := newLifecycle(t, rt, alloc, nil)
	for id, gpu := range map[string]string{"on-3": "3", "on-2": "2"} {
		if _, err := l.Launch(ctx, containerizer.Spec{ID: id, Command: []string{"x"}, GPUs: allocator.Request{Devices: []string{gpu}}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := alloc.Allocate(ctx, "not-a-container", allocator.Request{Devices: []string{"4"}}); err != nil {
		t.Fatal(err)
	}
	gpu := alloc.Devices()[3]
	if err := l.StopForReset(ctx, gpu, []string{"on-3", "not-a-container"}); err != nil {
		t.Fatal(err)
	}
	if owners, err := alloc.Owners("3"); err != nil || len(owners) != 0 {
		t.Errorf("GPU 3 still held: %v, %v", owners, err)
	}
	cs := l.Containers()
	if len(cs) != 1 || cs[0].ID != "on-2" || cs[0].State != containerizer.StateRunning {
		t.Errorf("containers left: %+v", cs)
	}
	if _, err := alloc.Allocation("not-a-container"); err != nil {
		t.Errorf("an owner that is no container was released: %v", err)
	}
	var zero containerizer.Lifecycle
	if err := zero.StopForReset(ctx, node.Device{}, []string{"on-2"}); err == nil {
		t.Error("a zero Lifecycle stopped something")
	}
}
