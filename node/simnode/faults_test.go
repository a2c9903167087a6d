package simnode_test

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
)

// reading is GPU i's polled health as NVML answers it.
func reading(t *testing.T, sim *simnode.Node, i int) nvmlnode.Reading {
	t.Helper()
	h, ret := sim.NVML().DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	return nvmlnode.ReadHealth(h)
}

// TestInject: each signal injected into a GPU is what its NVML answers,
// until Clear.
func TestInject(t *testing.T) {
	tests := []struct {
		signal node.Signal
		want   []node.Signal // conditions
	}{
		{node.Signal{Kind: node.SignalRecoveryAction, Value: node.RecoveryNodeReboot}, []node.Signal{{Kind: node.SignalRecoveryAction, Value: node.RecoveryNodeReboot}}},
		{node.Signal{Kind: node.SignalXID, Value: 109}, []node.Signal{{Kind: node.SignalRecoveryAction, Value: node.RecoveryGPUReset}}},
		{node.Signal{Kind: node.SignalXID, Value: 94}, nil},
		{node.Signal{Kind: node.SignalDoubleBitECC}, []node.Signal{{Kind: node.SignalRecoveryAction, Value: node.RecoveryGPUReset}}},
		{node.Signal{Kind: node.SignalRowRemapPending}, []node.Signal{{Kind: node.SignalRowRemapPending}}},
		{node.Signal{Kind: node.SignalRowRemapFailed}, []node.Signal{{Kind: node.SignalRowRemapFailed}}},
		{node.Signal{Kind: node.SignalRetiredPagesPending}, []node.Signal{{Kind: node.SignalRetiredPagesPending}}},
		{node.Signal{Kind: node.SignalThermalSlowdown}, []node.Signal{{Kind: node.SignalThermalSlowdown}}},
		{node.Signal{Kind: node.SignalPowerSlowdown}, []node.Signal{{Kind: node.SignalPowerSlowdown}}},
		{node.Signal{Kind: node.SignalLost}, []node.Signal{{Kind: node.SignalLost}}},
		{node.Signal{Kind: node.SignalXID, Value: 79}, []node.Signal{{Kind: node.SignalLost}}},
	}
	for _, tt := range tests {
		t.Run(tt.signal.String(), func(t *testing.T) {
			sim, err := simnode.New("dgx1-volta")
			if err != nil {
				t.Fatal(err)
			}
			if err := sim.Inject(3, tt.signal); err != nil {
				t.Fatal(err)
			}
			if got := reading(t, sim, 3).Conditions; !slices.Equal(got, tt.want) {
				t.Errorf("conditions %v, want %v", got, tt.want)
			}
			if got := reading(t, sim, 2).Conditions; len(got) != 0 {
				t.Errorf("another GPU: %v", got)
			}
			if err := sim.Clear(3); err != nil {
				t.Fatal(err)
			}
			if r := reading(t, sim, 3); len(r.Conditions) != 0 || !r.RecoveryKnown {
				t.Errorf("after Clear: %+v", r)
			}
		})
	}
	sim, err := simnode.New("dgx1-volta")
	if err != nil {
		t.Fatal(err)
	}
	before := reading(t, sim, 0)
	for _, s := range []node.Signal{{Kind: node.SignalNVLinkDown, Value: 1}, {Kind: node.SignalNVLinkErrors, Value: 5}, {Kind: node.SignalPCIeReplay, Value: 2}} {
		if err := sim.Inject(0, s); err != nil {
			t.Fatal(err)
		}
	}
	after := reading(t, sim, 0)
	if slices.Contains(after.LinksUp, 1) || !slices.Contains(before.LinksUp, 1) || after.NVLinkErrors != before.NVLinkErrors+5 || after.PCIeReplays != before.PCIeReplays+2 {
		t.Errorf("before %+v, after %+v", before, after)
	}
	for _, err := range []error{
		sim.Inject(8, node.Signal{Kind: node.SignalLost}),
		sim.InjectMIG(0, 1, 0, node.Signal{Kind: node.SignalLost}),
		sim.Clear(-1),
	} {
		if !errors.Is(err, node.ErrNotFound) && !errors.Is(err, node.ErrInvalid) {
			t.Errorf("a device that is not there: %v", err)
		}
	}
	if err := sim.Inject(0, node.Signal{Kind: node.SignalKind(99)}); !errors.Is(err, node.ErrInvalid) {
		t.Errorf("an unknown signal: %v", err)
	}
}

// TestInjectMIG: an XID injected into a MIG device is an event of its
// instance; a GPU's signal lands on its GPU.
func TestInjectMIG(t *testing.T) {
	sim, err := simnode.New("hgx-h100-mig")
	if err != nil {
		t.Fatal(err)
	}
	m := sim.MIGDevices(1)[0]
	lib := sim.NVML()
	set, _ := lib.EventSetCreate()
	h, _ := lib.DeviceGetHandleByIndex(1)
	if ret := h.RegisterEvents(nvml.EventTypeXidCriticalError, set); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if err := sim.InjectMIG(1, m.GI, m.CI, node.Signal{Kind: node.SignalXID, Value: 94}); err != nil {
		t.Fatal(err)
	}
	e, ret := set.Wait(5000)
	if ret != nvml.SUCCESS || e.EventData != 94 || e.GpuInstanceId != uint32(m.GI) || e.ComputeInstanceId != uint32(m.CI) {
		t.Fatalf("event %+v, %v", e, ret)
	}
	if err := sim.InjectMIG(1, m.GI, m.CI, node.Signal{Kind: node.SignalRowRemapPending}); err != nil {
		t.Fatal(err)
	}
	if got := reading(t, sim, 1).Conditions; !slices.Equal(got, []node.Signal{{Kind: node.SignalRowRemapPending}}) {
		t.Errorf("the parent's conditions: %v", got)
	}
}

// TestShareFaults: faults injected by one node into a host tree are seen
// by every node over the same tree (as by another process), events
// included, and cleared for all.
func TestShareFaults(t *testing.T) {
	testenv.RequireRoot(t)
	dir := filepath.Join(t.TempDir(), "host")
	ctx := context.Background()
	nodes := make([]*simnode.Node, 2)
	for k := range nodes {
		sim, err := simnode.New("dgx1-volta")
		if err != nil {
			t.Fatal(err)
		}
		h, err := sim.OpenHost(ctx, dir)
		if err != nil {
			t.Fatal(err)
		}
		if err := sim.ShareFaults(h); err != nil {
			t.Fatal(err)
		}
		nodes[k] = sim
	}
	injector, watcher := nodes[0], nodes[1]
	lib := watcher.NVML()
	set, _ := lib.EventSetCreate()
	h, _ := lib.DeviceGetHandleByIndex(3)
	if ret := h.RegisterEvents(nvml.EventTypeXidCriticalError, set); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if err := injector.Inject(3, node.Signal{Kind: node.SignalXID, Value: 79}); err != nil {
		t.Fatal(err)
	}
	e, ret := set.Wait(5000)
	if ret != nvml.SUCCESS || e.EventData != 79 {
		t.Fatalf("the watcher's event: %+v, %v", e, ret)
	}
	if r := reading(t, watcher, 3); !r.Lost {
		t.Fatalf("the watcher's GPU 3: %+v, want lost", r)
	}
	// A node made over the tree later sees the fault, not the event.
	late, err := simnode.New("dgx1-volta")
	if err != nil {
		t.Fatal(err)
	}
	hl, err := late.OpenHost(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := late.ShareFaults(hl); err != nil {
		t.Fatal(err)
	}
	if !reading(t, late, 3).Lost {
		t.Fatal("a node made later does not see the fault")
	}
	lset, _ := late.NVML().EventSetCreate()
	lh, _ := late.NVML().DeviceGetHandleByIndex(2)
	lh.RegisterEvents(nvml.EventTypeXidCriticalError, lset)
	if e, ret := lset.Wait(100); ret != nvml.ERROR_TIMEOUT {
		t.Fatalf("a node made later got an old event: %+v", e)
	}
	if err := injector.Clear(3); err != nil {
		t.Fatal(err)
	}
	for _, sim := range []*simnode.Node{watcher, late} {
		if r := reading(t, sim, 3); r.Lost || len(r.Conditions) != 0 {
			t.Fatalf("after Clear: %+v", r)
		}
	}
	if err := hl.Remove(); err != nil {
		t.Fatalf("Remove of a tree with faults: %v", err)
	}
}
