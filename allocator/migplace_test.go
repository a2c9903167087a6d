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

// placedNode is a fresh hgx-h100-dynmig (GPU 0: MIG enabled, no instance;
// GPU 1: a user's 3g.40gb at 0) and an allocator managing its layout
// through m (the simulated node's manager when nil).
func placedNode(t *testing.T, m func(*simnode.Node) allocator.MIGManager) (*simnode.Node, *allocator.Allocator) {
	t.Helper()
	sim, err := simnode.New("hgx-h100-dynmig", simnode.WithDriverVersion("580.159.04"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	inv, err := nvmlnode.Discover(context.Background(), nvmlnode.WithNVML(sim.NVML()), nvmlnode.WithDevRoot(dir), nvmlnode.WithProcRoot(dir), nvmlnode.WithSysRoot(dir))
	if err != nil {
		t.Fatal(err)
	}
	var mgr allocator.MIGManager = sim.MIGManager(nil)
	if m != nil {
		mgr = m(sim)
	}
	a, err := allocator.New(inv, allocator.WithMIGManager(mgr))
	if err != nil {
		t.Fatal(err)
	}
	return sim, a
}

// TestAllocateMIGAt: a MIG device is created at the placement asked for and
// held, destroyed on release; one in the way of an instance is refused with
// nothing changed; and a user's instance is never touched.
func TestAllocateMIGAt(t *testing.T) {
	ctx := context.Background()
	sim, a := placedNode(t, nil)
	al, err := a.AllocateMIGAt(ctx, "a", allocator.MIGAt{Parent: sim.UUID(0), Profile: "1g.10gb", Start: 3})
	if err != nil {
		t.Fatal(err)
	}
	made := sim.MIGDevices(0)
	if len(made) != 1 || made[0].Start != 3 || len(al.Devices) != 1 || al.Devices[0].UUID != made[0].UUID || al.Devices[0].MIG == nil || al.Devices[0].Index != 0 {
		t.Fatalf("allocated %+v, GPU 0 holds %+v", al.Devices, made)
	}
	if _, err := a.AllocateMIGAt(ctx, "b", allocator.MIGAt{Parent: sim.UUID(0), Profile: "2g.20gb", Start: 2}); !errors.Is(err, node.ErrInsufficient) {
		t.Fatalf("2g.20gb over the 1g.10gb: %v", err)
	}
	if _, err := a.AllocateMIGAt(ctx, "b", allocator.MIGAt{Parent: sim.UUID(1), Profile: "1g.10gb", Start: 1}); !errors.Is(err, node.ErrInsufficient) {
		t.Fatalf("1g.10gb inside the user's instance: %v", err)
	}
	if _, err := a.AllocateMIGAt(ctx, "b", allocator.MIGAt{Parent: sim.UUID(2), Profile: "1g.10gb", Start: 0}); !errors.Is(err, allocator.ErrDeviceUnavailable) {
		t.Fatalf("1g.10gb on a GPU with MIG off: %v", err)
	}
	if _, err := a.AllocateMIGAt(ctx, "b", allocator.MIGAt{Parent: sim.UUID(0), Profile: "9g.1tb", Start: 0}); !errors.Is(err, allocator.ErrUnknownMIGProfile) {
		t.Fatalf("an unknown profile: %v", err)
	}
	if _, err := a.AllocateMIGAt(ctx, "a", allocator.MIGAt{Parent: sim.UUID(0), Profile: "1g.10gb", Start: 4}); !errors.Is(err, allocator.ErrOwnerExists) {
		t.Fatalf("a second device for one owner: %v", err)
	}
	if n := len(sim.MIGDevices(0)); n != 1 || len(a.Allocations()) != 1 {
		t.Fatalf("refusals left GPU 0 with %d devices, allocations %v", n, a.Allocations())
	}
	if err := allocator.CheckInvariants(a); err != nil {
		t.Fatal(err)
	}
	if err := a.Release(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if n := len(sim.MIGDevices(0)); n != 0 || len(sim.MIGDevices(1)) != 1 {
		t.Fatalf("after the release GPU 0 holds %d devices, GPU 1 %v", n, sim.MIGDevices(1))
	}
}

// TestEmptyMIGParentWhole: a GPU with MIG enabled and no MIG device is
// handed out whole to a request naming it, and no MIG device is created on
// it meanwhile; while it has one, it is not handed out whole. A request
// that names no GPU never gets it, nor a GPU holding a user's instance.
func TestEmptyMIGParentWhole(t *testing.T) {
	ctx := context.Background()
	sim, a := placedNode(t, nil)
	whole, err := a.Allocate(ctx, "whole", allocator.Request{Devices: []string{sim.UUID(0)}})
	if err != nil {
		t.Fatal(err)
	}
	if len(whole.Devices) != 1 || whole.Devices[0].UUID != sim.UUID(0) {
		t.Fatalf("allocated %+v", whole.Devices)
	}
	if _, err := a.AllocateMIGAt(ctx, "mig", allocator.MIGAt{Parent: sim.UUID(0), Profile: "1g.10gb", Start: 0}); !errors.Is(err, allocator.ErrDeviceUnavailable) {
		t.Fatalf("a MIG device on the GPU held whole: %v", err)
	}
	// A request for a profile gets one made on GPU 1, beside the user's.
	if _, err := a.Allocate(ctx, "mig", allocator.Request{MIG: "1g.10gb"}); err != nil || len(sim.MIGDevices(0)) != 0 || len(sim.MIGDevices(1)) != 2 {
		t.Fatalf("a 1g.10gb request: %v; GPU 0 %v, GPU 1 %v", err, sim.MIGDevices(0), sim.MIGDevices(1))
	}
	if err := a.Release(ctx, "mig"); err != nil {
		t.Fatal(err)
	}
	if err := allocator.CheckInvariants(a); err != nil {
		t.Fatal(err)
	}
	if err := a.Release(ctx, "whole"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.AllocateMIGAt(ctx, "mig", allocator.MIGAt{Parent: sim.UUID(0), Profile: "1g.10gb", Start: 0}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Allocate(ctx, "whole", allocator.Request{Devices: []string{sim.UUID(0)}}); !errors.Is(err, allocator.ErrDeviceUnavailable) {
		t.Fatalf("the whole GPU while a MIG device exists on it: %v", err)
	}
	if _, err := a.Claim(ctx, "whole", []node.DeviceRef{{UUID: sim.UUID(0)}}); !errors.Is(err, allocator.ErrDeviceUnavailable) {
		t.Fatalf("claiming the whole GPU while a MIG device exists on it: %v", err)
	}
	if _, err := a.Allocate(ctx, "user", allocator.Request{Devices: []string{sim.UUID(1)}}); !errors.Is(err, allocator.ErrDeviceUnavailable) {
		t.Fatalf("the GPU with a user's instance, whole: %v", err)
	}
	if _, err := a.Allocate(ctx, "seven", allocator.Request{Count: 7}); !errors.Is(err, node.ErrInsufficient) {
		t.Fatalf("seven GPUs of six whole ones: %v", err)
	}
	if err := allocator.CheckInvariants(a); err != nil {
		t.Fatal(err)
	}
}

// creatorOnly is a MIG manager that cannot place devices.
type creatorOnly struct{ m *simnode.MIGManager }

func (c creatorOnly) CreateMIG(ctx context.Context, parent, profile string) (node.MIGDevice, error) {
	return c.m.CreateMIG(ctx, parent, profile)
}
func (c creatorOnly) DestroyMIG(ctx context.Context, parent, device string) error {
	return c.m.DestroyMIG(ctx, parent, device)
}

// TestAllocateMIGAtNoPlacer: without a manager that places devices,
// AllocateMIGAt is not supported.
func TestAllocateMIGAtNoPlacer(t *testing.T) {
	sim, a := placedNode(t, func(s *simnode.Node) allocator.MIGManager { return creatorOnly{s.MIGManager(nil)} })
	if _, err := a.AllocateMIGAt(context.Background(), "a", allocator.MIGAt{Parent: sim.UUID(0), Profile: "1g.10gb"}); !errors.Is(err, node.ErrNotSupported) {
		t.Fatalf("without a placer: %v", err)
	}
}
