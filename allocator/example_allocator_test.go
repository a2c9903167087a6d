package allocator_test

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
)

// discoverExample discovers a simulated DGX-1 (Volta); on a real sim,
// nvmlnode.Discover(ctx) with no options reads the host.
func discoverExample(ctx context.Context) (*node.Inventory, func(), error) {
	sim, err := simnode.New("dgx1-volta")
	if err != nil {
		return nil, nil, err
	}
	dir, err := os.MkdirTemp("", "example-")
	if err != nil {
		return nil, nil, err
	}
	inv, err := nvmlnode.Discover(ctx, nvmlnode.WithNVML(sim.NVML()),
		nvmlnode.WithDevRoot(dir), nvmlnode.WithProcRoot(dir), nvmlnode.WithSysRoot(dir))
	return inv, func() { os.RemoveAll(dir) }, err
}

func ExampleNew() {
	ctx := context.Background()
	inv, cleanup, err := discoverExample(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cleanup()
	stateDir, _ := os.MkdirTemp("", "gpuiso-state-")
	defer os.RemoveAll(stateDir)

	a, err := allocator.New(inv, allocator.WithStateDir(stateDir), allocator.WithQuota("team-a", 4))
	if err != nil {
		fmt.Println(err)
		return
	}
	if _, err := a.Allocate(ctx, "task-1", allocator.Request{Count: 4, Group: "team-a"}); err != nil {
		fmt.Println(err)
		return
	}
	// After a restart, New loads the state and Reconcile drops the owners
	// that are gone.
	b, err := allocator.New(inv, allocator.WithStateDir(stateDir), allocator.WithQuota("team-a", 4))
	if err != nil {
		fmt.Println(err)
		return
	}
	res, _ := b.Reconcile(ctx, []string{"task-1"})
	fmt.Println("kept:", res.Kept, "free:", b.Free())
	_, err = b.Allocate(ctx, "task-2", allocator.Request{Count: 1, Group: "team-a"})
	fmt.Println(errors.Is(err, allocator.ErrQuotaExceeded))
	// Output:
	// kept: [task-1] free: [4 5 6 7]
	// true
}

func ExampleAllocator_Allocate() {
	ctx := context.Background()
	inv, cleanup, err := discoverExample(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cleanup()
	a, err := allocator.New(inv)
	if err != nil {
		fmt.Println(err)
		return
	}
	show := func(owner string, r allocator.Request) {
		al, err := a.Allocate(ctx, owner, r)
		if err != nil {
			fmt.Println(err)
			return
		}
		var idx []int
		for _, d := range al.Devices {
			idx = append(idx, d.Index)
		}
		fmt.Println(owner, idx, inv.Topology.SetScore(idx))
	}
	show("pair", allocator.Request{Count: 2})                               // the best NVLink pair
	show("with-gpu-0", allocator.Request{Count: 2, Devices: []string{"0"}}) // GPU 0 and its best free partner
	show("numa-1", allocator.Request{Count: 2, Constraints: []allocator.Constraint{{Attribute: "numa_node", Operator: "=", Value: "1"}}})
	show("too-many", allocator.Request{Count: 5})
	// Output:
	// pair [2 3] 250
	// with-gpu-0 [0 4] 210
	// numa-1 [6 7] 250
	// allocate 5 gpus for too-many: requested 5, 2 free: not enough free GPUs
}
