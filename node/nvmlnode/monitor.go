package nvmlnode

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuiso/gpuiso/node"
)

// applicationXIDs are the XIDs that the monitor once took for an
// application's own faults.
var applicationXIDs = [...]uint64{13, 31, 43, 45, 68, 109}

// ApplicationXID tells whether xid is one of 13, 31, 43, 45, 68 and 109,
// the XIDs the monitor once ignored.
//
// Deprecated: the monitor classifies XIDs by a node.HealthTable
// (node.DefaultHealthTable, WithHealthTable), after NVIDIA's XID catalog:
// there 109 needs a GPU reset and 94 only a restart of the application.
// Use node.DefaultHealthTable().Classify.
func ApplicationXID(xid uint64) bool { return slices.Contains(applicationXIDs[:], xid) }

// Target is what the monitor marks: an allocator, in practice. A target
// that also has MarkHealthy(ctx, device) error (the allocator does) gets
// the devices the monitor marked back when their signals clear.
type Target interface {
	// Devices are the GPUs to watch, as they are now.
	Devices() []node.Device
	// MarkUnhealthy stops a GPU, or one MIG device of a GPU (by "GPU-" or
	// "MIG-" UUID), from being handed out and returns its owners.
	MarkUnhealthy(ctx context.Context, device, reason string) ([]string, error)
}

// healer is a Target that can hand a device out again.
type healer interface {
	MarkHealthy(ctx context.Context, device string) error
}

// informer is a Target that can note a signal on a device that stays in
// service (the allocator's Inform).
type informer interface {
	Inform(ctx context.Context, device, reason string) error
}

// HealthEvent is what the monitor saw and did.
type HealthEvent struct {
	// Device is the GPU, as it is now (unhealthy when the verdict is,
	// unless MIG is set).
	Device node.Device
	// MIG, when set, is the MIG device of Device that the driver named as
	// the event's source: it alone is marked unhealthy.
	MIG *node.MIGDevice
	// XID is the XID of an XID event, else 0.
	XID uint64
	// Verdict is the signal seen and what the health table makes of it:
	// StateUnhealthy marked the device unhealthy, StateInform only tells.
	Verdict node.Verdict
	// Healed is set when the device, marked unhealthy by the monitor, was
	// marked healthy again because its signals cleared; Verdict is then
	// the one it was marked for.
	Healed bool
	// Owners are those holding the GPU: their containers are affected.
	Owners []string
	// Err is set when the event could not be acted on (the device stays as
	// it was) and, with Reset ResetFailed, to why the reset failed.
	Err error
	// Reset is the step of a GPU reset (WithReset) the event tells of;
	// ResetNone for every other event.
	Reset ResetStep
}

// DefaultHealthPeriod is how often the monitor reads the GPUs' polled
// health signals by default.
const DefaultHealthPeriod = 10 * time.Second

// MonitorOption configures Monitor.
type MonitorOption func(*monitorConfig) error

type monitorConfig struct {
	table  node.HealthTable
	period time.Duration
	quiet  time.Duration
	// With WithReset: the resetter and the policy (nil: wait).
	resetter node.Resetter
	policy   ResetPolicy
}

// WithHealthTable sets the table that turns signals into health (default
// node.DefaultHealthTable). A table that does not hold (node.HealthTable's
// Validate) is refused.
func WithHealthTable(t node.HealthTable) MonitorOption {
	return func(c *monitorConfig) error {
		if err := t.Validate(); err != nil {
			return err
		}
		c.table = slices.Clone(t)
		return nil
	}
}

// WithHealthPeriod sets how often the polled signals are read (default
// DefaultHealthPeriod); it must be positive.
func WithHealthPeriod(d time.Duration) MonitorOption {
	return func(c *monitorConfig) error {
		if d <= 0 {
			return fmt.Errorf("health period %s: %w", d, node.ErrInvalid)
		}
		c.period = d
		return nil
	}
}

// WithQuietPeriod sets how long a device marked unhealthy must go without
// a new fault before it may be healthy again (default: the health
// period); it must not be negative.
func WithQuietPeriod(d time.Duration) MonitorOption {
	return func(c *monitorConfig) error {
		if d < 0 {
			return fmt.Errorf("quiet period %s: %w", d, node.ErrInvalid)
		}
		c.quiet = d
		return nil
	}
}

// monitorPoll is how long one NVML wait lasts, bounding how long
// cancellation takes to be noticed.
const monitorPoll = 100 * time.Millisecond

// gpuWatch is what the monitor keeps of one GPU.
type gpuWatch struct {
	handle     nvml.Device // nil while lost or not watched
	registered bool        // events registered on handle
	base, prev Reading
	read       bool
	// marked are the devices (the GPU, its MIG devices, by UUID) the
	// monitor marked unhealthy, with the verdict.
	marked map[string]node.Verdict
	// lastFault is when a fault was last seen.
	lastFault time.Time
	// shown are the inform conditions told, not told again while they
	// hold.
	shown map[node.Signal]bool
	// noted are the devices (by UUID) the monitor noted an informing
	// signal on, with the reason and when the signal was last seen.
	noted map[string]note
	// reset, with WithReset, is the GPU's reset to come.
	reset *pendingReset
}

// note is an informing signal noted on a device.
type note struct {
	reason string
	seen   time.Time
}

// Monitor watches the node's GPUs until ctx is done: the driver's events
// (XID critical errors, double-bit ECC errors, recovery-action changes)
// as they come, and every health period (WithHealthPeriod) the polled
// signals (ReadHealth: the recovery action, remapped rows, pending retired
// pages, NVLinks and their error counters, PCIe replays, slowdowns, a GPU
// fallen off the bus). The health table (WithHealthTable) makes of each
// signal a node.Verdict. An unhealthy one marks the GPU unhealthy (an
// event attributed to a GPU instance, the MIG device alone) and is
// reported to notify with the owners; an inform one is only reported (a
// condition once while it holds) and, where the target has
// Inform(ctx, device, reason) error (the allocator does), noted on the
// device, which stays in service; the note goes (MarkHealthy, reported
// with Healed set) once the signal was not seen for the quiet period.
//
// A device the monitor marked is healthy again on its own (MarkHealthy,
// when the target has it, reported with Healed set) at the first period
// when its GPU is not lost, no unhealthy condition holds and no fault came
// for the quiet period (WithQuietPeriod); when it was marked for a fault
// whose action is a GPU reset or a reboot, the driver must also give a
// recovery action, and it must be none: on a driver without one such a
// device stays unhealthy until MarkHealthy. A device unhealthy when the
// monitor starts, for a reason a Verdict wrote, is taken as marked by it.
// A device marked for another reason since is left alone. A device
// marked for an action more disruptive than a new signal's (a reboot, a
// reset) keeps it.
//
// With WithReset, a GPU whose action is a GPU reset is reset once nothing
// holds it, and given back or marked for a reboot (see WithReset).
//
// NVML is initialised for the monitor's lifetime. A GPU that cannot be
// watched is reported to notify as an event with only Err set; the
// monitor fails only when none can be watched. It returns ctx's error when
// ctx ends.
func Monitor(ctx context.Context, lib nvml.Interface, target Target, notify func(HealthEvent), opts ...MonitorOption) error {
	if lib == nil || target == nil || notify == nil {
		return fmt.Errorf("monitor: nil NVML, target or callback: %w", node.ErrInvalid)
	}
	cfg := monitorConfig{period: DefaultHealthPeriod, quiet: -1}
	for _, o := range opts {
		if o == nil {
			return fmt.Errorf("monitor: nil option: %w", node.ErrInvalid)
		}
		if err := o(&cfg); err != nil {
			return fmt.Errorf("monitor: %w", err)
		}
	}
	if cfg.table == nil {
		cfg.table = node.DefaultHealthTable()
	}
	if cfg.quiet < 0 {
		cfg.quiet = cfg.period
	}
	if cfg.resetter != nil {
		_, tells := target.(owners)
		_, heals := target.(healer)
		if !tells || !heals {
			return fmt.Errorf("monitor: reset: the target cannot tell a GPU's owners or mark it healthy: %w", node.ErrInvalid)
		}
	}
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return fmt.Errorf("monitor: %w", nvmlError("init", -1, ret))
	}
	defer lib.Shutdown()
	set, ret := lib.EventSetCreate()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("monitor: %w", nvmlError("create event set", -1, ret))
	}
	defer set.Free()
	m := &monitor{ctx: ctx, lib: lib, target: target, notify: notify, cfg: cfg, set: set, started: time.Now()}
	m.devices = target.Devices()
	m.gpus = make([]gpuWatch, len(m.devices))
	var problems []error
	watched, gone := 0, 0
	for p, d := range m.devices {
		m.gpus[p].marked = map[string]node.Verdict{}
		m.gpus[p].shown = map[node.Signal]bool{}
		m.gpus[p].noted = map[string]note{}
		m.adopt(p)
		switch ret := m.watch(p); ret {
		case nvml.SUCCESS:
			watched++
		case nvml.ERROR_GPU_IS_LOST:
			gone++
			if d.Health.Healthy {
				m.verdict(p, nil, node.Signal{Kind: node.SignalLost})
			}
		default:
			problems = append(problems, nvmlError("watch events", d.Index, ret))
		}
	}
	if watched == 0 && gone < len(m.devices) {
		return fmt.Errorf("monitor: no GPU can be watched: %w", errors.Join(problems...))
	}
	for _, err := range problems {
		notify(HealthEvent{Err: err})
	}
	m.poll()
	next := time.Now().Add(cfg.period)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		if !time.Now().Before(next) {
			m.poll()
			next = time.Now().Add(cfg.period)
		}
		wait := min(monitorPoll, max(time.Until(next), time.Millisecond))
		e, ret := set.Wait(uint32(max(wait/time.Millisecond, 1)))
		switch ret {
		case nvml.SUCCESS:
		case nvml.ERROR_TIMEOUT:
			continue
		case nvml.ERROR_GPU_IS_LOST:
			// A watched GPU fell off the bus without saying which: ask
			// each, and stop watching the lost ones.
			for p := range m.gpus {
				h := m.gpus[p].handle
				if h == nil {
					continue
				}
				if _, ret := h.GetUUID(); ret == nvml.ERROR_GPU_IS_LOST {
					m.gpus[p].handle, m.gpus[p].registered = nil, false
					m.verdict(p, nil, node.Signal{Kind: node.SignalLost})
				}
			}
			continue
		default:
			if err := ctx.Err(); err != nil {
				return err
			}
			return fmt.Errorf("monitor: %w", nvmlError("wait for events", -1, ret))
		}
		m.event(e)
	}
}

// monitor is one Monitor call's state.
type monitor struct {
	ctx     context.Context
	lib     nvml.Interface
	target  Target
	notify  func(HealthEvent)
	cfg     monitorConfig
	set     nvml.EventSet
	started time.Time
	devices []node.Device // as the monitor started
	gpus    []gpuWatch
	// resetting is set during a reset step (resetStep).
	resetting bool
}

// watch finds GPU p's handle and registers its events.
func (m *monitor) watch(p int) nvml.Return {
	g := &m.gpus[p]
	h, ret := handle(m.lib, m.devices[p])
	if ret != nvml.SUCCESS {
		return ret
	}
	types := uint64(nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError | nvml.EventTypeGpuRecoveryAction)
	if ret = h.RegisterEvents(types, m.set); ret != nvml.SUCCESS && ret != nvml.ERROR_GPU_IS_LOST {
		types = nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError
		if ret = h.RegisterEvents(types, m.set); ret != nvml.SUCCESS && ret != nvml.ERROR_GPU_IS_LOST {
			ret = h.RegisterEvents(nvml.EventTypeXidCriticalError, m.set)
		}
	}
	if ret != nvml.SUCCESS {
		return ret
	}
	g.handle, g.registered = h, true
	return nvml.SUCCESS
}

// adopt takes GPU p and its MIG devices as marked by the monitor when
// they are unhealthy for a reason a Verdict wrote (a monitor before this
// one).
func (m *monitor) adopt(p int) {
	g := &m.gpus[p]
	d := m.devices[p]
	if a, ok := node.VerdictAction(d.Health.Reason); ok && !d.Health.Healthy {
		v := node.Verdict{State: node.StateUnhealthy, Action: a}
		g.marked[d.UUID] = v
		g.lastFault = m.started
		if a == node.ActionResetGPU && m.cfg.resetter != nil {
			g.reset = &pendingReset{verdict: v, reason: d.Health.Reason}
		}
	}
	for _, mig := range d.MIGDevices {
		if a, ok := node.VerdictAction(mig.Health.Reason); ok && !mig.Health.Healthy {
			g.marked[mig.UUID] = node.Verdict{State: node.StateUnhealthy, Action: a}
			g.lastFault = m.started
		}
	}
}

// event handles one NVML event.
func (m *monitor) event(e nvml.EventData) {
	p := slices.IndexFunc(m.gpus, func(g gpuWatch) bool { return g.handle != nil && sameDevice(g.handle, e.Device) })
	if p < 0 {
		return
	}
	var s node.Signal
	switch {
	case e.EventType&nvml.EventTypeXidCriticalError != 0:
		s = node.Signal{Kind: node.SignalXID, Value: e.EventData}
	case e.EventType&nvml.EventTypeDoubleBitEccError != 0:
		s = node.Signal{Kind: node.SignalDoubleBitECC}
	case e.EventType&nvml.EventTypeGpuRecoveryAction != 0:
		// The action itself is read now, as the next poll would.
		m.pollGPU(p)
		return
	default:
		return
	}
	// The target's MIG devices as they are now: a MIG device made since
	// the monitor started (dynamic MIG) is one of them.
	if migs := migSources(m.target.Devices()[p], e); len(migs) > 0 {
		for _, mig := range migs {
			m.verdict(p, &mig, s)
		}
		return
	}
	m.verdict(p, nil, s)
	m.resetStep(p) // with WithReset, a GPU free now is reset now
}

// verdict acts on signal s of GPU p (or of its MIG device mig) and tells.
func (m *monitor) verdict(p int, mig *node.MIGDevice, s node.Signal) {
	v := m.cfg.table.Classify(s)
	g := &m.gpus[p]
	dev := m.target.Devices()[p]
	ev := HealthEvent{Device: dev, MIG: mig, Verdict: v}
	if s.Kind == node.SignalXID {
		ev.XID = s.Value
	}
	if v.State == node.StateUnhealthy {
		g.lastFault = time.Now()
		uuid, current := dev.UUID, dev.Health
		if mig != nil {
			uuid, current = mig.UUID, mig.Health
		}
		if a, ok := node.VerdictAction(current.Reason); ok && !current.Healthy && a > v.Action {
			// Marked already for a more disruptive action (a reboot
			// after a failed reset): it stands.
			m.notify(ev)
			return
		}
		ev.Owners, ev.Err = m.target.MarkUnhealthy(m.ctx, uuid, v.String())
		if ev.Err == nil {
			g.marked[uuid] = v
			if mig == nil && v.Action == node.ActionResetGPU && m.cfg.resetter != nil && g.reset == nil {
				g.reset = &pendingReset{verdict: v, reason: v.String()}
			}
			if mig != nil {
				ev.MIG.Health = v.Health()
			} else {
				ev.Device.Health = v.Health()
			}
		}
	}
	if v.State == node.StateInform {
		uuid := dev.UUID
		if mig != nil {
			uuid = mig.UUID
		}
		if in, ok := m.target.(informer); ok {
			if ev.Err = in.Inform(m.ctx, uuid, v.String()); ev.Err == nil {
				g.noted[uuid] = note{reason: v.String(), seen: time.Now()}
			}
		}
	}
	if v.State != node.StateHealthy {
		m.notify(ev)
	}
}

// poll reads the polled signals of every GPU.
func (m *monitor) poll() {
	for p := range m.gpus {
		m.pollGPU(p)
	}
}

// pollGPU reads GPU p's polled signals, acts on them and heals what
// cleared.
func (m *monitor) pollGPU(p int) {
	g := &m.gpus[p]
	var r Reading
	if g.handle == nil {
		// Lost, or never watched: try again (a reset brings a GPU back).
		switch ret := m.watch(p); ret {
		case nvml.SUCCESS:
		case nvml.ERROR_GPU_IS_LOST:
			r = Reading{Lost: true, Conditions: []node.Signal{{Kind: node.SignalLost}}}
		default:
			return
		}
	}
	if !r.Lost {
		r = ReadHealth(g.handle)
	}
	if r.Lost {
		g.handle, g.registered = nil, false
	}
	if !g.read && !r.Lost {
		g.base, g.prev, g.read = r, r, true
	}
	conditions, events := changes(g.base, g.prev, r)
	conditions = append(slices.Clone(r.Conditions), conditions...)
	if !r.Lost {
		g.prev = r
	}
	health := m.target.Devices()[p].Health
	unhealthy := false
	holding := "" // the first informing condition that holds
	for _, s := range conditions {
		v := m.cfg.table.Classify(s)
		switch v.State {
		case node.StateUnhealthy:
			unhealthy = true
			g.lastFault = time.Now()
			if health.Healthy {
				m.verdict(p, nil, s)
				health = m.target.Devices()[p].Health
			}
		case node.StateInform:
			if holding == "" {
				holding = v.String()
			}
			if !g.shown[s] {
				m.verdict(p, nil, s)
			}
		}
	}
	for s := range g.shown {
		if !slices.Contains(conditions, s) {
			delete(g.shown, s)
		}
	}
	for _, s := range conditions {
		g.shown[s] = true
	}
	for _, s := range events {
		m.verdict(p, nil, s)
	}
	if !unhealthy && !r.Lost {
		m.heal(p, r)
	}
	m.unnote(p, holding)
	m.resetStep(p)
}

// unnote takes off the devices of GPU p the notes of informing signals not
// seen for the quiet period, where the note is still the monitor's; the
// GPU's note becomes holding instead, an informing condition of the GPU
// that still holds, if any.
func (m *monitor) unnote(p int, holding string) {
	g := &m.gpus[p]
	h, ok := m.target.(healer)
	if !ok || len(g.noted) == 0 {
		return
	}
	dev := m.target.Devices()[p]
	for uuid, n := range g.noted {
		if time.Since(n.seen) < m.cfg.quiet {
			continue
		}
		delete(g.noted, uuid)
		if uuid == dev.UUID && holding != "" {
			if n.reason == holding {
				g.noted[uuid] = note{reason: holding, seen: time.Now()}
				continue
			}
			if in, ok := m.target.(informer); ok && dev.Health.Healthy && dev.Health.Reason == n.reason {
				if in.Inform(m.ctx, uuid, holding) == nil {
					g.noted[uuid] = note{reason: holding, seen: time.Now()}
				}
				continue
			}
		}
		current, ev := dev.Health, HealthEvent{Device: dev, Healed: true, Verdict: node.Verdict{State: node.StateInform}}
		if uuid != dev.UUID {
			i := slices.IndexFunc(dev.MIGDevices, func(mig node.MIGDevice) bool { return mig.UUID == uuid })
			if i < 0 {
				continue
			}
			mig := dev.MIGDevices[i]
			ev.MIG, current = &mig, mig.Health
		}
		if !current.Healthy || current.Reason != n.reason {
			continue // marked since, or noted by another
		}
		if ev.Err = h.MarkHealthy(m.ctx, uuid); ev.Err == nil {
			if ev.MIG != nil {
				ev.MIG.Health = node.Healthy()
			} else {
				ev.Device.Health = node.Healthy()
			}
		}
		m.notify(ev)
	}
}

// heal marks healthy again the devices of GPU p that the monitor marked,
// when nothing holds them unhealthy any more (see Monitor).
func (m *monitor) heal(p int, r Reading) {
	g := &m.gpus[p]
	h, ok := m.target.(healer)
	if !ok || len(g.marked) == 0 || g.reset != nil || time.Since(g.lastFault) < m.cfg.quiet {
		return
	}
	if r.RecoveryKnown && r.RecoveryAction != node.RecoveryNone {
		return
	}
	dev := m.target.Devices()[p]
	for uuid, v := range g.marked {
		if v.Action >= node.ActionResetGPU && !r.RecoveryKnown {
			continue
		}
		ev := HealthEvent{Device: dev, Verdict: v, Healed: true}
		current := dev.Health
		if uuid != dev.UUID {
			i := slices.IndexFunc(dev.MIGDevices, func(mig node.MIGDevice) bool { return mig.UUID == uuid })
			if i < 0 {
				delete(g.marked, uuid) // destroyed since
				continue
			}
			mig := dev.MIGDevices[i]
			ev.MIG, current = &mig, mig.Health
		}
		if current.Healthy {
			delete(g.marked, uuid) // marked healthy by another
			continue
		}
		if _, ok := node.VerdictAction(current.Reason); !ok {
			delete(g.marked, uuid) // marked since for another reason
			continue
		}
		if ev.Err = h.MarkHealthy(m.ctx, uuid); ev.Err == nil {
			delete(g.marked, uuid)
			if ev.MIG != nil {
				ev.MIG.Health = node.Healthy()
			} else {
				ev.Device.Health = node.Healthy()
			}
		}
		m.notify(ev)
	}
}

// noInstance is the GPU- or compute-instance id of an event about the
// whole GPU.
const noInstance = 0xFFFFFFFF

// migSources are the MIG devices of d an event names by GPU instance (and,
// when set, compute instance); none for an event about the whole GPU.
func migSources(d node.Device, e nvml.EventData) []node.MIGDevice {
	if e.GpuInstanceId == noInstance || len(d.MIGDevices) == 0 {
		return nil
	}
	var out []node.MIGDevice
	for _, m := range d.MIGDevices {
		if uint32(m.GI) == e.GpuInstanceId && (e.ComputeInstanceId == noInstance || uint32(m.CI) == e.ComputeInstanceId) {
			out = append(out, m)
		}
	}
	return out
}

// handle finds the NVML handle of d: by UUID, then bus id, then index.
func handle(lib nvml.Interface, d node.Device) (nvml.Device, nvml.Return) {
	if d.UUID != "" {
		if h, ret := lib.DeviceGetHandleByUUID(d.UUID); ret == nvml.SUCCESS {
			return h, ret
		}
	}
	if d.BusID != "" {
		if h, ret := lib.DeviceGetHandleByPciBusId(d.BusID); ret == nvml.SUCCESS {
			return h, ret
		}
	}
	return lib.DeviceGetHandleByIndex(d.Index)
}

// sameDevice compares two NVML handles; handles of a type that cannot be
// compared are never the same.
func sameDevice(x, y nvml.Device) (same bool) {
	defer func() {
		if recover() != nil {
			same = false
		}
	}()
	return x == y
}
