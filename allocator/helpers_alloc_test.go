package allocator_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
)

var (
	invMu    sync.Mutex
	invCache = map[string]*node.Inventory{}
)

// simInventory discovers the shipped topology name once per test binary
// and returns a copy.
func simInventory(name string) (*node.Inventory, error) {
	invMu.Lock()
	defer invMu.Unlock()
	if inv, ok := invCache[name]; ok {
		return inv.Clone(), nil
	}
	sim, err := simnode.New(name, simnode.WithDriverVersion("535.104.05"))
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "gpuiso-alloc-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	inv, err := nvmlnode.Discover(context.Background(), nvmlnode.WithNVML(sim.NVML()),
		nvmlnode.WithDevRoot(dir), nvmlnode.WithProcRoot(dir), nvmlnode.WithSysRoot(dir))
	if err != nil {
		return nil, fmt.Errorf("discover %s: %w", name, err)
	}
	invCache[name] = inv
	return inv.Clone(), nil
}

func simInv(tb testing.TB, name string) *node.Inventory {
	tb.Helper()
	inv, err := simInventory(name)
	if err != nil {
		tb.Fatal(err)
	}
	return inv
}

func newAlloc(tb testing.TB, name string, opts ...allocator.Option) *allocator.Allocator {
	tb.Helper()
	a, err := allocator.New(simInv(tb, name), opts...)
	if err != nil {
		tb.Fatal(err)
	}
	return a
}

func allocIndexes(al allocator.Allocation) []int {
	out := make([]int, len(al.Devices))
	for i, d := range al.Devices {
		out[i] = d.Index
	}
	return out
}

func allocOK(tb testing.TB, a *allocator.Allocator, owner string, r allocator.Request) allocator.Allocation {
	tb.Helper()
	al, err := a.Allocate(context.Background(), owner, r)
	if err != nil {
		tb.Fatal(err)
	}
	if err := allocator.CheckInvariants(a); err != nil {
		tb.Fatal(err)
	}
	return al
}
