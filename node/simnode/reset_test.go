package simnode_test

import (
	"context"
	"errors"
	"testing"

	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/simnode"
)

var _ node.Resetter = (*simnode.Node)(nil)

// TestResetGPU: a reset heals the GPU it names and no other; with
// FailResets it fails, typed, and the GPU stays as it is; every reset
// asked is counted.
func TestResetGPU(t *testing.T) {
	ctx := context.Background()
	sim, err := simnode.New("dgx1-volta")
	if err != nil {
		t.Fatal(err)
	}
	xid := node.Signal{Kind: node.SignalXID, Value: 109}
	for _, i := range []int{2, 3} {
		if err := sim.Inject(i, xid); err != nil {
			t.Fatal(err)
		}
	}
	gpu := node.Device{Index: 3, UUID: sim.UUID(3)}
	if err := sim.ResetGPU(ctx, gpu); err != nil {
		t.Fatal(err)
	}
	if got := reading(t, sim, 3).Conditions; len(got) != 0 {
		t.Errorf("after a reset: %v", got)
	}
	if got := reading(t, sim, 2).Conditions; len(got) != 1 {
		t.Errorf("another GPU healed with it: %v", got)
	}
	if err := sim.FailResets(2, true); err != nil {
		t.Fatal(err)
	}
	err = sim.ResetGPU(ctx, node.Device{Index: 2, UUID: sim.UUID(2)})
	var re *node.ResetError
	if !errors.As(err, &re) || !errors.Is(err, node.ErrResetFailed) || !errors.Is(err, node.ErrUnavailable) || !errors.Is(err, simnode.ErrResetFault) || re.GPU != sim.UUID(2) {
		t.Fatalf("failing reset: %v", err)
	}
	if got := reading(t, sim, 2).Conditions; len(got) != 1 {
		t.Errorf("a failed reset healed: %v", got)
	}
	// The mode stays through a reset that Clear stands for.
	if err := sim.Clear(2); err != nil {
		t.Fatal(err)
	}
	if err := sim.ResetGPU(ctx, node.Device{Index: 2, UUID: sim.UUID(2)}); !errors.Is(err, node.ErrResetFailed) {
		t.Fatalf("reset mode lost in Clear: %v", err)
	}
	if err := sim.FailResets(2, false); err != nil {
		t.Fatal(err)
	}
	if err := sim.ResetGPU(ctx, node.Device{Index: -1, BusID: sim.Spec().GPUs[2].BusID}); err != nil {
		t.Fatalf("reset by bus id: %v", err)
	}
	if got := [...]int{sim.Resets(1), sim.Resets(2), sim.Resets(3)}; got != [...]int{0, 3, 1} {
		t.Errorf("resets counted %v, want [0 3 1]", got)
	}
	if err := sim.ResetGPU(ctx, node.Device{UUID: "GPU-none"}); !errors.Is(err, simnode.ErrNoSuchGPU) {
		t.Errorf("unknown GPU: %v", err)
	}
	if err := sim.FailResets(99, true); !errors.Is(err, simnode.ErrNoSuchGPU) {
		t.Errorf("FailResets of an unknown GPU: %v", err)
	}
}
