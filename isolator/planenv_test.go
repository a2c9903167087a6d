package isolator_test

import (
	"slices"
	"testing"

	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/node"
)

// TestPlanEnvMadeAgain: a plan is the one maker of the device variables:
// made again from an earlier plan's Env for other GPUs, it names the new
// GPUs once, keeps the rest in order, and a plan without GPUs says void.
func TestPlanEnvMadeAgain(t *testing.T) {
	inv := migInv()
	first, err := isolator.NewPlan("job", inv, []node.DeviceRef{inv.Devices[1].Ref()}, nil, []string{"A=1", "B=2"})
	if err != nil {
		t.Fatal(err)
	}
	again, err := isolator.NewPlan("job", inv, []node.DeviceRef{inv.Devices[0].Ref()}, nil, first.Env)
	if err != nil {
		t.Fatal(err)
	}
	u := inv.Devices[0].UUID
	if want := []string{"NVIDIA_VISIBLE_DEVICES=" + u, "CUDA_VISIBLE_DEVICES=" + u, "A=1", "B=2"}; !slices.Equal(again.Env, want) {
		t.Fatalf("env made again = %v, want %v", again.Env, want)
	}
	none, err := isolator.NewPlan("job", inv, nil, nil, again.Env)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"NVIDIA_VISIBLE_DEVICES=void", "CUDA_VISIBLE_DEVICES=", "A=1", "B=2"}; !slices.Equal(none.Env, want) {
		t.Fatalf("env without GPUs = %v, want %v", none.Env, want)
	}
}
