package nvmlnode_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
)

var _ node.Resetter = nvmlnode.SMIResetter{}

// released records what a reset policy was asked and, when release is
// set, releases the owners it was told of.
type released struct {
	a       *allocator.Allocator
	release bool
	mu      sync.Mutex
	asked   []string // "<gpu index>:<owner>"
}

func (r *released) Release(ctx context.Context, gpu node.Device, owners []string) error {
	r.mu.Lock()
	for _, o := range owners {
		r.asked = append(r.asked, strings.Join([]string{string(rune('0' + gpu.Index)), o}, ":"))
	}
	r.mu.Unlock()
	if !r.release {
		return nil
	}
	var errs []error
	for _, o := range owners {
		errs = append(errs, r.a.Release(ctx, o))
	}
	return errors.Join(errs...)
}

func (r *released) told() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.asked)
}

// resetNode is a simulated node, an allocator over it with "job" holding
// GPU 3 and "other" GPU 2.
func resetNode(t *testing.T) (*simnode.Node, *allocator.Allocator) {
	t.Helper()
	sim := newNode(t, "dgx1-volta")
	a, err := allocator.New(simInv(t, "dgx1-volta"))
	if err != nil {
		t.Fatal(err)
	}
	allocOK(t, a, "job", allocator.Request{Devices: []string{"3"}})
	allocOK(t, a, "other", allocator.Request{Devices: []string{"2"}})
	return sim, a
}

func isReset(step nvmlnode.ResetStep) func(nvmlnode.HealthEvent) bool {
	return func(e nvmlnode.HealthEvent) bool { return e.Reset == step }
}

// TestMonitorReset: with WithReset, a GPU whose signal asks for a reset
// is out of service, its owners are told to the policy (which releases
// them), then it is reset and offered again; the owner of another GPU is
// never told, and that GPU never reset.
func TestMonitorReset(t *testing.T) {
	sim, a := resetNode(t)
	policy := &released{a: a, release: true}
	events := watchHealth(t, sim.NVML(), a, nvmlnode.WithReset(sim, policy))
	if err := sim.Inject(3, node.Signal{Kind: node.SignalXID, Value: 109}); err != nil {
		t.Fatal(err)
	}
	e := awaitEvent(t, events, isReset(nvmlnode.ResetWaiting))
	if e.Device.Index != 3 || !slices.Equal(e.Owners, []string{"job"}) || e.Err != nil || e.Device.Health.Healthy {
		t.Fatalf("waiting: %+v", e)
	}
	e = awaitEvent(t, events, isReset(nvmlnode.ResetDone))
	if e.Device.Index != 3 || !e.Healed || e.Err != nil || !e.Device.Health.Healthy {
		t.Fatalf("done: %+v", e)
	}
	if got := allocIndexes(allocOK(t, a, "next", allocator.Request{Devices: []string{"3"}})); !slices.Equal(got, []int{3}) {
		t.Fatalf("GPU 3 not offered again: %v", got)
	}
	if got := policy.told(); !slices.Equal(got, []string{"3:job"}) {
		t.Errorf("policy told %v, want [3:job]", got)
	}
	if n2, n3 := sim.Resets(2), sim.Resets(3); n2 != 0 || n3 != 1 {
		t.Errorf("resets: GPU 2 %d, GPU 3 %d", n2, n3)
	}
	if al, err := a.Allocation("other"); err != nil || !slices.Equal(allocIndexes(al), []int{2}) {
		t.Errorf("the other GPU's holder: %+v, %v", al, err)
	}
}

// TestMonitorResetFails: a reset that fails leaves the GPU unhealthy with
// a reboot as its action, and it is not reset again; with no policy the
// monitor waits for the owner to release the GPU.
func TestMonitorResetFails(t *testing.T) {
	sim, a := resetNode(t)
	if err := sim.FailResets(3, true); err != nil {
		t.Fatal(err)
	}
	events := watchHealth(t, sim.NVML(), a, nvmlnode.WithReset(sim, nil))
	if err := sim.Inject(3, node.Signal{Kind: node.SignalRecoveryAction, Value: node.RecoveryDrainAndReset}); err != nil {
		t.Fatal(err)
	}
	e := awaitEvent(t, events, isReset(nvmlnode.ResetWaiting))
	if !slices.Equal(e.Owners, []string{"job"}) {
		t.Fatalf("waiting: %+v", e)
	}
	if n := sim.Resets(3); n != 0 {
		t.Fatalf("reset while held: %d", n)
	}
	if err := a.Release(context.Background(), "job"); err != nil {
		t.Fatal(err)
	}
	e = awaitEvent(t, events, isReset(nvmlnode.ResetFailed))
	if !errors.Is(e.Err, node.ErrResetFailed) || e.Verdict.Action != node.ActionReboot || e.Device.Health.Healthy {
		t.Fatalf("failed: %+v", e)
	}
	h := a.Devices()[3].Health
	if act, ok := node.VerdictAction(h.Reason); h.Healthy || !ok || act != node.ActionReboot {
		t.Fatalf("GPU 3 after a failed reset: %s", h)
	}
	// The fault told again leaves the reboot as it is: no second reset,
	// while polls go on (the informing note of another GPU comes).
	if err := sim.Inject(3, node.Signal{Kind: node.SignalXID, Value: 109}); err != nil {
		t.Fatal(err)
	}
	awaitEvent(t, events, func(e nvmlnode.HealthEvent) bool { return e.XID == 109 })
	if h := a.Devices()[3].Health; !strings.HasSuffix(h.Reason, ": reboot") {
		t.Fatalf("GPU 3 after the fault told again: %s", h)
	}
	if err := sim.Inject(5, node.Signal{Kind: node.SignalThermalSlowdown}); err != nil {
		t.Fatal(err)
	}
	awaitEvent(t, events, func(e nvmlnode.HealthEvent) bool { return e.Device.Index == 5 })
	if n := sim.Resets(3); n != 1 {
		t.Errorf("resets of GPU 3: %d, want 1", n)
	}
	if _, err := a.Allocate(context.Background(), "next", allocator.Request{Devices: []string{"3"}}); err == nil {
		t.Error("GPU 3 handed out after a failed reset")
	}
	if sim.Resets(2) != 0 || !a.Devices()[2].Health.Healthy {
		t.Error("the other GPU touched")
	}
}

// TestMonitorNoReset: without WithReset nothing is reset, and a driver's
// processes on a GPU keep its reset waiting.
func TestMonitorNoReset(t *testing.T) {
	t.Run("off", func(t *testing.T) {
		sim, a := resetNode(t)
		events := watchHealth(t, sim.NVML(), a)
		if err := a.Release(context.Background(), "job"); err != nil {
			t.Fatal(err)
		}
		if err := sim.Inject(3, node.Signal{Kind: node.SignalXID, Value: 109}); err != nil {
			t.Fatal(err)
		}
		awaitEvent(t, events, func(e nvmlnode.HealthEvent) bool { return e.Verdict.State == node.StateUnhealthy })
		if err := sim.Inject(5, node.Signal{Kind: node.SignalThermalSlowdown}); err != nil {
			t.Fatal(err)
		}
		awaitEvent(t, events, func(e nvmlnode.HealthEvent) bool { return e.Device.Index == 5 })
		if n := sim.Resets(3); n != 0 || a.Devices()[3].Health.Healthy {
			t.Fatalf("reset without the option: %d", n)
		}
	})
	t.Run("processes", func(t *testing.T) {
		sim, a := resetNode(t)
		if err := a.Release(context.Background(), "job"); err != nil {
			t.Fatal(err)
		}
		if err := sim.SetProcesses(3, nvml.ProcessInfo{Pid: 4242}); err != nil {
			t.Fatal(err)
		}
		events := watchHealth(t, sim.NVML(), a, nvmlnode.WithReset(sim, nil))
		if err := sim.Inject(3, node.Signal{Kind: node.SignalXID, Value: 109}); err != nil {
			t.Fatal(err)
		}
		e := awaitEvent(t, events, isReset(nvmlnode.ResetWaiting))
		if !errors.Is(e.Err, node.ErrUnavailable) || sim.Resets(3) != 0 {
			t.Fatalf("waiting for processes: %+v, resets %d", e, sim.Resets(3))
		}
		if err := sim.SetProcesses(3); err != nil {
			t.Fatal(err)
		}
		awaitEvent(t, events, isReset(nvmlnode.ResetDone))
		awaitHealth(t, a, 3, true)
	})
}

// TestMonitorResetAdopted: a GPU unhealthy for a reset when the monitor
// starts (as a monitor before it marked it) is reset.
func TestMonitorResetAdopted(t *testing.T) {
	sim, a := resetNode(t)
	v := node.DefaultHealthTable().Classify(node.Signal{Kind: node.SignalXID, Value: 119})
	if _, err := a.MarkUnhealthy(context.Background(), "4", v.String()); err != nil {
		t.Fatal(err)
	}
	events := watchHealth(t, sim.NVML(), a, nvmlnode.WithReset(sim, nil))
	e := awaitEvent(t, events, isReset(nvmlnode.ResetDone))
	if e.Device.Index != 4 || sim.Resets(4) != 1 {
		t.Fatalf("adopted: %+v", e)
	}
	awaitHealth(t, a, 4, true)
}

// noOwners is a target that cannot tell a device's owners.
type noOwners struct{ nvmlnode.Target }

func TestWithResetRefused(t *testing.T) {
	sim, a := resetNode(t)
	ctx := context.Background()
	notify := func(nvmlnode.HealthEvent) {}
	if err := nvmlnode.Monitor(ctx, sim.NVML(), a, notify, nvmlnode.WithReset(nil, nil)); !errors.Is(err, node.ErrInvalid) {
		t.Errorf("nil resetter: %v", err)
	}
	if err := nvmlnode.Monitor(ctx, sim.NVML(), noOwners{a}, notify, nvmlnode.WithReset(sim, nil)); !errors.Is(err, node.ErrInvalid) {
		t.Errorf("a target without owners: %v", err)
	}
}

// TestSMIResetter runs a stand-in for nvidia-smi: the arguments it is
// given, and its failure as a *node.ResetError with its words.
func TestSMIResetter(t *testing.T) {
	dir := t.TempDir()
	args := filepath.Join(dir, "args")
	tool := filepath.Join(dir, "nvidia-smi")
	script := "#!/bin/sh\necho \"$@\" > " + args + "\n[ \"$3\" = fail ] && { echo 'GPU is in use'; exit 3; }\nexit 0\n"
	if err := os.WriteFile(tool, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	r := nvmlnode.SMIResetter{Path: tool}
	ctx := context.Background()
	if err := r.ResetGPU(ctx, node.Device{UUID: "GPU-1", BusID: "00000000:07:00.0"}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(args); string(b) != "--gpu-reset -i 00000000:07:00.0\n" {
		t.Errorf("arguments %q", b)
	}
	err := r.ResetGPU(ctx, node.Device{UUID: "GPU-2", BusID: "fail"})
	var re *node.ResetError
	if !errors.As(err, &re) || re.GPU != "GPU-2" || !errors.Is(err, node.ErrResetFailed) || !strings.Contains(err.Error(), "GPU is in use") {
		t.Errorf("failing tool: %v", err)
	}
	if err := r.ResetGPU(ctx, node.Device{Index: 1}); !errors.Is(err, node.ErrInvalid) {
		t.Errorf("no id: %v", err)
	}
	missing := nvmlnode.SMIResetter{Path: filepath.Join(dir, "none")}
	if err := missing.ResetGPU(ctx, node.Device{UUID: "GPU-3"}); !errors.Is(err, node.ErrResetFailed) {
		t.Errorf("missing tool: %v", err)
	}
}

// TestMonitorResetMIG: a GPU with MIG devices is not reset (a reset
// destroys them): it is told, and stays out of service.
func TestMonitorResetMIG(t *testing.T) {
	sim := newNode(t, "dgx-a100-mig")
	inv := simInv(t, "dgx-a100-mig")
	gpu := slices.IndexFunc(inv.Devices, func(d node.Device) bool { return len(d.MIGDevices) > 0 })
	if gpu < 0 {
		t.Fatal("no GPU with MIG devices")
	}
	a, err := allocator.New(inv)
	if err != nil {
		t.Fatal(err)
	}
	events := watchHealth(t, sim.NVML(), a, nvmlnode.WithReset(sim, nil))
	if err := sim.Inject(gpu, node.Signal{Kind: node.SignalRowRemapPending}); err != nil {
		t.Fatal(err)
	}
	e := awaitEvent(t, events, isReset(nvmlnode.ResetWaiting))
	if e.Device.Index != gpu || !errors.Is(e.Err, node.ErrNotSupported) {
		t.Fatalf("event %+v", e)
	}
	if n := sim.Resets(gpu); n != 0 || a.Devices()[gpu].Health.Healthy {
		t.Fatalf("GPU %d with MIG devices: %d resets, %s", gpu, n, a.Devices()[gpu].Health)
	}
}
