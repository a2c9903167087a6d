package allocator_test

import (
	"context"
	"errors"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
)

// dynamicNode is a fresh dgx-a100-mig (GPU 3: MIG enabled, no instances),
// its inventory and an allocator managing its layout.
func dynamicNode(t *testing.T, opts ...allocator.Option) (*simnode.Node, *simnode.MIGManager, *allocator.Allocator) {
	t.Helper()
	sim, err := simnode.New("dgx-a100-mig", simnode.WithDriverVersion("535.104.05"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	inv, err := nvmlnode.Discover(context.Background(), nvmlnode.WithNVML(sim.NVML()), nvmlnode.WithDevRoot(dir), nvmlnode.WithProcRoot(dir), nvmlnode.WithSysRoot(dir))
	if err != nil {
		t.Fatal(err)
	}
	mgr := sim.MIGManager(nil)
	a, err := allocator.New(inv, append(opts, allocator.WithMIGManager(mgr))...)
	if err != nil {
		t.Fatal(err)
	}
	return sim, mgr, a
}

// TestDynamicMIG: a profile the layout cannot serve gets a MIG device
// created on a GPU with room (MIG enabled, nothing there), which discovery
// then finds with the same UUID, and which is destroyed on release.
func TestDynamicMIG(t *testing.T) {
	ctx := context.Background()
	sim, _, a := dynamicNode(t)
	first := allocOK(t, a, "a", allocator.Request{MIG: "3g.20gb"}) // GPU 1's own
	if first.Devices[0].Index != 1 || len(sim.MIGDevices(3)) != 0 {
		t.Fatalf("first 3g.20gb on GPU %d, GPU 3 holds %d", first.Devices[0].Index, len(sim.MIGDevices(3)))
	}
	second := allocOK(t, a, "b", allocator.Request{MIG: "3g.20gb"})
	made := sim.MIGDevices(3)
	if second.Devices[0].Index != 3 || len(made) != 1 || made[0].UUID != second.Devices[0].UUID || made[0].Profile != "3g.20gb" {
		t.Fatalf("second 3g.20gb = %+v, GPU 3 holds %+v", second.Devices[0], made)
	}
	dir := t.TempDir()
	inv, err := nvmlnode.Discover(ctx, nvmlnode.WithNVML(sim.NVML()), nvmlnode.WithDevRoot(dir), nvmlnode.WithProcRoot(dir), nvmlnode.WithSysRoot(dir))
	if err != nil || len(inv.Devices[3].MIGDevices) != 1 || inv.Devices[3].MIGDevices[0].UUID != made[0].UUID {
		t.Fatalf("rediscovered GPU 3: %+v, %v", inv.Devices[3].MIGDevices, err)
	}
	if d := a.Devices()[3]; len(d.MIGDevices) != 1 || d.MIGDevices[0].UUID != made[0].UUID {
		t.Fatalf("allocator's GPU 3: %+v", d.MIGDevices)
	}
	if err := a.Release(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if n := len(sim.MIGDevices(3)); n != 0 || len(a.Devices()[3].MIGDevices) != 0 {
		t.Fatalf("GPU 3 holds %d MIG devices after the release", n)
	}
	if err := a.Release(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if len(sim.MIGDevices(1)) != 3 {
		t.Fatal("a MIG device of the layout was destroyed on release")
	}
	if err := allocator.CheckInvariants(a); err != nil {
		t.Fatal(err)
	}
}

// TestDynamicMIGTransactional: a request whose second creation fails gets
// nothing, and the first device it created is destroyed again: the layout
// and the allocator are as before.
func TestDynamicMIGTransactional(t *testing.T) {
	ctx := context.Background()
	sim, mgr, a := dynamicNode(t)
	allocOK(t, a, "a", allocator.Request{MIG: "3g.20gb"})
	before := a.FreeMIG()
	mgr.FailAfter(1)
	_, err := a.Allocate(ctx, "b", allocator.Request{MIG: "3g.20gb", Count: 2})
	if !errors.Is(err, simnode.ErrMIGFault) {
		t.Fatalf("Allocate = %v, want the injected fault", err)
	}
	if n := len(sim.MIGDevices(3)); n != 0 {
		t.Fatalf("GPU 3 holds %d MIG devices after a failed request", n)
	}
	if _, err := a.Allocation("b"); !errors.Is(err, allocator.ErrUnknownOwner) || len(a.FreeMIG()) != len(before) {
		t.Fatalf("failed request left b %v, %d free MIG devices (want %d)", err, len(a.FreeMIG()), len(before))
	}
	if err := allocator.CheckInvariants(a); err != nil {
		t.Fatal(err)
	}
	// Room runs out: the GPU takes two 3g.20gb, a third is refused whole.
	mgr.FailAfter(-1)
	allocOK(t, a, "c", allocator.Request{MIG: "3g.20gb", Count: 2})
	if _, err := a.Allocate(ctx, "d", allocator.Request{MIG: "3g.20gb"}); !errors.Is(err, node.ErrInsufficient) {
		t.Fatalf("a third 3g.20gb: %v", err)
	}
	if n := len(sim.MIGDevices(3)); n != 2 {
		t.Fatalf("GPU 3 holds %d MIG devices, want 2", n)
	}
	// A quota refusal after creation undoes it too.
	_, _, q := dynamicNode(t, allocator.WithQuota("g", 1))
	allocOK(t, q, "x", allocator.Request{MIG: "1g.5gb", Group: "g"})
	if _, err := q.Allocate(ctx, "y", allocator.Request{MIG: "4g.20gb", Group: "g"}); !errors.Is(err, allocator.ErrQuotaExceeded) {
		t.Fatalf("over quota: %v", err)
	}
	if n := len(q.Devices()[3].MIGDevices); n != 0 {
		t.Fatalf("quota refusal left %d created devices", n)
	}
}
