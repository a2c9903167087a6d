package nvmlnode

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuiso/gpuiso/node"
)

// SMIResetter resets a GPU with NVIDIA's tool, as NVML offers no call
// for it: `nvidia-smi --gpu-reset -i <bus id>` (the UUID where the device
// has no bus id). The driver refuses while a process uses the GPU or its
// persistence mode is on; the tool's words come back in the error.
type SMIResetter struct {
	// Path is nvidia-smi's path; empty, "nvidia-smi" is looked up in PATH.
	Path string
}

// ResetGPU resets gpu. A failure is a *node.ResetError (matching
// node.ErrResetFailed); a device with neither bus id nor UUID is
// node.ErrInvalid, a tool not found node.ErrNotSupported too.
func (r SMIResetter) ResetGPU(ctx context.Context, gpu node.Device) error {
	id := gpu.BusID
	if id == "" {
		id = gpu.UUID
	}
	if id == "" {
		return fmt.Errorf("reset GPU %d: neither bus id nor UUID: %w", gpu.Index, node.ErrInvalid)
	}
	name := gpu.UUID
	if name == "" {
		name = id
	}
	path := r.Path
	if path == "" {
		p, err := exec.LookPath("nvidia-smi")
		if err != nil {
			return &node.ResetError{GPU: name, Err: errors.Join(err, node.ErrNotSupported)}
		}
		path = p
	}
	out, err := exec.CommandContext(ctx, path, "--gpu-reset", "-i", id).CombinedOutput()
	if err != nil {
		if msg := strings.TrimSpace(string(out)); msg != "" {
			err = fmt.Errorf("%s: %w", msg, err)
		}
		return &node.ResetError{GPU: name, Err: err}
	}
	return nil
}

// resetStep moves GPU p's reset on (WithReset): it tells the policy of
// the owners holding it once, waits while any does or the driver lists a
// process on it, then resets it, reads its signals again and gives it
// back, or marks it for a reboot.
func (m *monitor) resetStep(p int) {
	g := &m.gpus[p]
	pr := g.reset
	if pr == nil || m.resetting {
		return // none, or a step of another GPU's under way: the next poll
	}
	m.resetting = true
	defer func() { m.resetting = false }()
	dev := m.target.Devices()[p]
	if a, ok := node.VerdictAction(dev.Health.Reason); dev.Health.Healthy || !ok || a != node.ActionResetGPU {
		g.reset = nil // healthy again, or marked since for another reason
		return
	}
	if len(dev.MIGDevices) > 0 {
		// A reset destroys the GPU's instances, which the inventory and
		// their owners' claims name: it stays out of service, for an
		// operator, as without WithReset.
		g.reset = nil
		m.notify(HealthEvent{Device: dev, Verdict: pr.verdict, Reset: ResetWaiting,
			Err: fmt.Errorf("GPU %d has MIG devices: not reset: %w", dev.Index, node.ErrNotSupported)})
		return
	}
	holders, err := m.target.(owners).Owners(dev.UUID)
	if err != nil {
		if !pr.ownersFailed {
			pr.ownersFailed = true
			m.notify(HealthEvent{Device: dev, Verdict: pr.verdict, Reset: ResetWaiting, Err: err})
		}
		return
	}
	pr.ownersFailed = false
	if len(holders) > 0 && !pr.told {
		pr.told = true
		ev := HealthEvent{Device: dev, Verdict: pr.verdict, Owners: holders, Reset: ResetWaiting}
		if m.cfg.policy != nil {
			ev.Err = m.cfg.policy.Release(m.ctx, dev, holders)
		}
		m.notify(ev)
		// A policy that released them at once lets the reset go on now.
		if holders, err = m.target.(owners).Owners(dev.UUID); err != nil {
			return
		}
	}
	if len(holders) > 0 {
		return
	}
	if n := processesOn(g.handle); n > 0 {
		if !pr.toldBusy {
			pr.toldBusy = true
			m.notify(HealthEvent{Device: dev, Verdict: pr.verdict, Reset: ResetWaiting,
				Err: fmt.Errorf("GPU %d: %d processes on it: %w", dev.Index, n, node.ErrUnavailable)})
		}
		return
	}
	err = m.cfg.resetter.ResetGPU(m.ctx, dev)
	if m.ctx.Err() != nil {
		return // the next monitor takes it from here
	}
	g.reset = nil
	if err == nil {
		err = m.afterReset(p)
	}
	m.dropStale(p)
	if err != nil {
		m.resetFailed(p, pr, err)
		return
	}
	m.resetDone(p, pr)
}

// dropStale takes the events queued now: those of GPU p came before its
// reset (the fault it was reset for, told again) and are dropped; the
// others are handled.
func (m *monitor) dropStale(p int) {
	for {
		e, ret := m.set.Wait(0)
		if ret != nvml.SUCCESS {
			return
		}
		if h := m.gpus[p].handle; h != nil && sameDevice(h, e.Device) {
			continue
		}
		m.event(e)
	}
}

// processesOn is how many processes the driver lists on the GPU; 0 when
// it cannot tell (a lost GPU, a call not supported).
func processesOn(h nvml.Device) int {
	if h == nil {
		return 0
	}
	n := 0
	if ps, ret := h.GetComputeRunningProcesses(); ret == nvml.SUCCESS {
		n += len(ps)
	}
	if ps, ret := h.GetGraphicsRunningProcesses(); ret == nvml.SUCCESS {
		n += len(ps)
	}
	return n
}

// afterReset reads GPU p's signals again after its reset: an error when
// it is lost or a condition still makes it unhealthy.
func (m *monitor) afterReset(p int) error {
	g := &m.gpus[p]
	if g.handle == nil {
		if ret := m.watch(p); ret != nvml.SUCCESS {
			return fmt.Errorf("after the reset: %w", nvmlError("watch events", m.devices[p].Index, ret))
		}
	}
	r := ReadHealth(g.handle)
	if r.Lost {
		g.handle, g.registered = nil, false
		return fmt.Errorf("after the reset: the GPU is lost: %w", node.ErrUnavailable)
	}
	g.prev = r
	if !g.read {
		g.base, g.read = r, true
	}
	for _, s := range r.Conditions {
		if v := m.cfg.table.Classify(s); v.State == node.StateUnhealthy {
			return fmt.Errorf("after the reset: %s: %w", v, node.ErrUnavailable)
		}
	}
	return nil
}

// resetFailed marks GPU p for a reboot after its reset failed with err.
func (m *monitor) resetFailed(p int, pr *pendingReset, err error) {
	g := &m.gpus[p]
	dev := m.target.Devices()[p]
	v := node.Verdict{Signal: pr.verdict.Signal, State: node.StateUnhealthy, Action: node.ActionReboot, Reason: "GPU reset failed"}
	ev := HealthEvent{Device: dev, Verdict: v, Reset: ResetFailed, Err: err}
	owners, merr := m.target.MarkUnhealthy(m.ctx, dev.UUID, rebootReason(pr.reason))
	ev.Owners = owners
	if merr == nil {
		g.marked[dev.UUID] = v
		ev.Device.Health = node.Unhealthy(rebootReason(pr.reason))
	} else {
		ev.Err = errors.Join(err, merr)
	}
	g.lastFault = time.Now()
	m.notify(ev)
}

// rebootReason is the health reason of a GPU whose reset failed, after
// the reason it was marked with ("XID 109 (...): reset-gpu"): "XID 109
// (...), reset failed: reboot", whose action (node.VerdictAction) is a
// reboot.
func rebootReason(reason string) string {
	if i := strings.LastIndex(reason, ": "); i >= 0 {
		reason = reason[:i]
	}
	if reason == "" {
		reason = "GPU"
	}
	return reason + ", reset failed: " + node.ActionReboot.String()
}

// resetDone gives GPU p back after a reset: it and the MIG devices the
// monitor marked are healthy again.
func (m *monitor) resetDone(p int, pr *pendingReset) {
	g := &m.gpus[p]
	h, _ := m.target.(healer)
	dev := m.target.Devices()[p]
	ev := HealthEvent{Device: dev, Verdict: pr.verdict, Healed: true, Reset: ResetDone}
	var errs []error
	for uuid := range g.marked {
		if h == nil {
			errs = append(errs, fmt.Errorf("mark %s healthy: the target cannot: %w", uuid, node.ErrNotSupported))
			continue
		}
		if err := h.MarkHealthy(m.ctx, uuid); err != nil {
			errs = append(errs, err)
			continue
		}
		delete(g.marked, uuid)
	}
	if ev.Err = errors.Join(errs...); ev.Err == nil {
		g.lastFault = time.Time{}
		ev.Device = m.target.Devices()[p]
	}
	m.notify(ev)
}

// ResetStep is a step of a GPU reset, as a HealthEvent tells it.
type ResetStep int

// The steps.
const (
	// ResetNone: the event is not about a reset.
	ResetNone ResetStep = iota
	// ResetWaiting: the GPU waits for its reset while Owners hold it
	// (the reset policy was asked to release them; Err: what it said),
	// or, Owners empty, while the driver lists processes on it or its
	// owners cannot be read (Err says which); a GPU with MIG devices is
	// not reset at all (Err matches node.ErrNotSupported).
	ResetWaiting
	// ResetDone: the GPU was reset, its signals read again were clear,
	// and it is healthy again (Healed is set too).
	ResetDone
	// ResetFailed: the reset failed, or the signals read again after it
	// still made the GPU unhealthy: it stays unhealthy, its Verdict's
	// action now a reboot; Err says why.
	ResetFailed
)

var resetStepNames = [...]string{"none", "waiting", "done", "failed"}

func (s ResetStep) String() string {
	if s >= 0 && int(s) < len(resetStepNames) {
		return resetStepNames[s]
	}
	return fmt.Sprintf("reset-step(%d)", int(s))
}

// ResetPolicy releases the work that holds a GPU waiting for a reset
// (WithReset): the importer's, which alone knows what its owners are
// (a container of its own to stop, a claim the cluster evicts, a job to
// leave running). The monitor never ends a process itself.
type ResetPolicy interface {
	// Release is asked once per reset, when the GPU gpu (unhealthy now)
	// waits for one while owners hold it: it may stop their work and
	// release the GPU (the allocator's Release), at once or later, or do
	// nothing and let them end on their own. The monitor waits for the
	// GPU to be free either way; what Release returns is only told
	// (ResetWaiting, Err). It must not block for long: the monitor waits
	// for it.
	Release(ctx context.Context, gpu node.Device, owners []string) error
}

// ResetPolicyFunc is a function as a ResetPolicy.
type ResetPolicyFunc func(ctx context.Context, gpu node.Device, owners []string) error

// Release calls f.
func (f ResetPolicyFunc) Release(ctx context.Context, gpu node.Device, owners []string) error {
	return f(ctx, gpu, owners)
}

// owners is a Target that tells who holds a device now (the allocator's
// Owners): WithReset needs it.
type owners interface {
	Owners(device string) ([]string, error)
}

// WithReset makes the monitor reset a GPU instead of leaving it out of
// service, through r: a GPU marked unhealthy for a signal whose action is
// a GPU reset (a MIG device's own XID aside) waits for its reset, out of
// service. The owners holding it are told to policy once (nil: the
// policy is to wait, and they are not told); when the target says no
// owner holds it any more and the driver lists no process on it, r
// resets it, and its signals are read again: all clear, the GPU and its
// MIG devices are healthy again at once (no quiet period); a failed
// reset, or a signal still unhealthy after it, leaves the GPU unhealthy
// with the action of the verdict a reboot (the reason "...: reboot"),
// which no reset follows. Each step is told (HealthEvent.Reset). Only the
// GPU waiting is touched: other GPUs and their owners are not. A GPU with
// MIG devices is not reset (a reset destroys them): it is told once
// (ResetWaiting, Err matching node.ErrNotSupported) and stays out of
// service, as without WithReset.
//
// A GPU waiting for its reset is healthy again only through it: the
// signals clearing do not heal it, as they do without WithReset. A GPU
// unhealthy for a reset when the monitor starts (for a reason a Verdict
// wrote) waits for its reset too. The target must tell a device's owners
// (Owners(device string) ([]string, error), as the allocator does), else
// Monitor refuses the option, and one that cannot mark a device healthy
// (MarkHealthy); a nil r is refused.
func WithReset(r node.Resetter, policy ResetPolicy) MonitorOption {
	return func(c *monitorConfig) error {
		if r == nil {
			return fmt.Errorf("reset: no resetter: %w", node.ErrInvalid)
		}
		c.resetter, c.policy = r, policy
		return nil
	}
}

// pendingReset is a GPU waiting for its reset.
type pendingReset struct {
	// verdict is the one the GPU was marked for, reason its health
	// reason then.
	verdict node.Verdict
	reason  string
	// told is set once the policy was asked to release the owners,
	// toldBusy once the driver's processes on the GPU were told, and
	// ownersFailed while the owners cannot be read (told once).
	told, toldBusy, ownersFailed bool
}
