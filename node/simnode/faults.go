package simnode

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/record"
)

// gpuFaults are the faults injected into one GPU: what its polled health
// calls answer.
type gpuFaults struct {
	RecoveryAction uint64 `json:"recoveryAction,omitempty"`
	RowsPending    bool   `json:"rowsPending,omitempty"`
	RowsFailed     bool   `json:"rowsFailed,omitempty"`
	PagesPending   bool   `json:"pagesPending,omitempty"`
	LinksDown      []int  `json:"linksDown,omitempty"`
	NVLinkErrors   uint64 `json:"nvlinkErrors,omitempty"`
	PCIeReplays    uint64 `json:"pcieReplays,omitempty"`
	Thermal        bool   `json:"thermal,omitempty"`
	Power          bool   `json:"power,omitempty"`
	Lost           bool   `json:"lost,omitempty"`
	// ResetFails makes a reset of the GPU fail (FailResets); Resets
	// counts the resets asked of it. Neither is a condition: both stay
	// through a reset.
	ResetFails bool `json:"resetFails,omitempty"`
	Resets     int  `json:"resets,omitempty"`
}

// clear is f with every condition gone, as after a GPU reset: the
// counters stay (they only grow), and so does the reset mode.
func (f gpuFaults) clear() gpuFaults {
	return gpuFaults{NVLinkErrors: f.NVLinkErrors, PCIeReplays: f.PCIeReplays, ResetFails: f.ResetFails, Resets: f.Resets}
}

// faultEvent is an event injected into a host tree, numbered so that each
// node reading the tree delivers it once.
type faultEvent struct {
	Seq  uint64 `json:"seq"`
	GPU  int    `json:"gpu"`
	GI   uint32 `json:"gi"`
	CI   uint32 `json:"ci"`
	Type uint64 `json:"type"`
	Data uint64 `json:"data"`
}

// savedFaults are the faults of a host tree's GPUs (by index) and the
// last events injected.
type savedFaults struct {
	GPUs   map[string]gpuFaults `json:"gpus"`
	Events []faultEvent         `json:"events,omitempty"`
	Seq    uint64               `json:"seq"`
}

// keptEvents is how many events a host tree keeps: a node that reads the
// tree less often than this many are injected misses the oldest.
const keptEvents = 64

// The faults of a host tree are an entry of package record, format
// "gpuiso-sim-health", version 1, in the tree's proc side.
const (
	faultsFormat  = "gpuiso-sim-health"
	faultsVersion = 1
	faultsKey     = "gpuiso-sim-health"
)

func faultsPath(h *Host) string {
	return filepath.Join(h.ProcRoot, "driver", "nvidia", "gpuiso-sim-health.json")
}

func faultsFile(h *Host) (*record.File[savedFaults], error) {
	return record.NewFile(faultsPath(h), faultsKey, record.Options[savedFaults]{
		Format: faultsFormat, Version: faultsVersion, Perm: 0o644, NoSync: true,
	})
}

// readFaults reads h's faults; a tree without any has none.
func readFaults(f *record.File[savedFaults]) (savedFaults, error) {
	e, err := f.Read()
	if errors.Is(err, record.ErrNoRecord) {
		return savedFaults{GPUs: map[string]gpuFaults{}}, nil
	}
	if err != nil {
		return savedFaults{}, err
	}
	if e.Data.GPUs == nil {
		e.Data.GPUs = map[string]gpuFaults{}
	}
	return e.Data, nil
}

// ShareFaults keeps the node's injected faults in host tree h from now on:
// Inject, InjectMIG, Clear, Lose and Restore write them there, and the
// node's NVML reads them from there, so that every node made over the same
// tree, in any process (a kubelet plugin, gpuinfo --inject), sees the
// same faults and gets each event injected since. The faults the node
// held before are replaced by the tree's. A nil h is refused
// (node.ErrInvalid).
func (n *Node) ShareFaults(h *Host) error {
	if h == nil {
		return fmt.Errorf("share simulated faults: no host tree: %w", node.ErrInvalid)
	}
	f, err := faultsFile(h)
	if err != nil {
		return fmt.Errorf("share simulated faults: %w", err)
	}
	saved, err := readFaults(f)
	if err != nil {
		return fmt.Errorf("share simulated faults: %w", err)
	}
	n.mu.Lock()
	n.faultHost, n.faultFile = h, f
	n.faultStamp = fileStamp{}
	n.seenSeq = saved.Seq // events before now are not this node's
	n.mu.Unlock()
	n.syncFaults()
	return nil
}

// fileStamp tells whether a file changed since it was read.
type fileStamp struct {
	mod  time.Time
	size int64
	ino  uint64
}

func stampOf(fi os.FileInfo) fileStamp {
	_, ino, _ := linux.Inode(fi)
	return fileStamp{mod: fi.ModTime(), size: fi.Size(), ino: ino}
}

// syncFaults reads the host tree's faults when they changed, and delivers
// the events injected since the last read. Without a host tree it does
// nothing.
func (n *Node) syncFaults() {
	n.mu.Lock()
	f, stamp := n.faultFile, n.faultStamp
	n.mu.Unlock()
	if f == nil {
		return
	}
	fi, err := os.Stat(f.Path())
	if err != nil || stampOf(fi) == stamp {
		return
	}
	saved, err := readFaults(f)
	if err != nil {
		return // a write under way, or a tree removed: read next time
	}
	var events []faultEvent
	n.mu.Lock()
	n.faultStamp = stampOf(fi)
	for i := range n.faults {
		n.faults[i] = saved.GPUs[strconv.Itoa(i)]
	}
	for _, e := range saved.Events {
		if e.Seq > n.seenSeq {
			events = append(events, e)
		}
	}
	n.seenSeq = max(n.seenSeq, saved.Seq)
	n.mu.Unlock()
	for _, e := range events {
		if e.GPU >= 0 && e.GPU < n.Len() {
			n.deliverTo(e.GPU, e.Type, e.Data, e.GI, e.CI)
		}
	}
}

// sharesFaults tells whether the node keeps its faults in a host tree.
func (n *Node) sharesFaults() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.faultFile != nil
}

// changeFaults applies change to GPU i's faults and delivers events (the
// whole GPU's unless they name an instance), in the host tree when the
// node shares its faults, else in the node.
func (n *Node) changeFaults(i int, change func(*gpuFaults), events ...faultEvent) error {
	n.mu.Lock()
	h, f := n.faultHost, n.faultFile
	if f == nil {
		change(&n.faults[i])
		n.mu.Unlock()
		for _, e := range events {
			n.deliverTo(i, e.Type, e.Data, e.GI, e.CI)
		}
		return nil
	}
	n.mu.Unlock()
	lock, err := lockHost(context.Background(), h.Root, HostLockTimeout)
	if err != nil {
		return err
	}
	defer func() {
		linux.Unlock(lock)
		lock.Close()
	}()
	saved, err := readFaults(f)
	if err != nil {
		return err
	}
	key := strconv.Itoa(i)
	g := saved.GPUs[key]
	change(&g)
	saved.GPUs[key] = g
	for _, e := range events {
		saved.Seq++
		e.Seq, e.GPU = saved.Seq, i
		saved.Events = append(saved.Events, e)
	}
	if len(saved.Events) > keptEvents {
		saved.Events = slices.Clone(saved.Events[len(saved.Events)-keptEvents:])
	}
	if err := f.Write(record.Entry[savedFaults]{Phase: record.Completed, Data: saved}); err != nil {
		return err
	}
	n.syncFaults()
	return nil
}

// faultsOf are GPU i's faults now.
func (n *Node) faultsOf(i int) gpuFaults {
	n.syncFaults()
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.faults[i]
}

// recoveryFor is the recovery action a driver gives after signal s, by
// the default health table: a reset or a reboot where the table's action
// is one, else none is set (false).
func recoveryFor(s node.Signal) (uint64, bool) {
	switch node.DefaultHealthTable().Classify(s).Action {
	case node.ActionResetGPU:
		return node.RecoveryGPUReset, true
	case node.ActionReboot:
		return node.RecoveryNodeReboot, true
	}
	return 0, false
}

// Inject injects health signal s into GPU i, as its driver would report
// it: an XID or a double-bit ECC error is delivered as an event to the
// event sets registered for it, and when the default health table says
// the fault needs a reset or a reboot the driver's recovery action says so
// too (XID 79 also makes the GPU fall off the bus, as Lose does); a
// recovery action is set and delivered as a recovery-action event and XID
// 154; the other signals hold until Clear (NVLink errors and PCIe replays
// add s.Value to their counters, an NVLink down takes link s.Value down).
// With ShareFaults, the tree holds them. An unknown signal kind is
// refused (node.ErrInvalid).
func (n *Node) Inject(i int, s node.Signal) error {
	if i < 0 || i >= n.Len() {
		return fmt.Errorf("inject %s into GPU %d of %d: %w", s, i, n.Len(), ErrNoSuchGPU)
	}
	return n.inject(i, s, invalidInstance, invalidInstance)
}

// InjectMIG injects s into the MIG device at GPU instance gi, compute
// instance ci of GPU i: an XID or a double-bit ECC error is attributed to
// that instance; a signal NVML reports for the whole GPU (the recovery
// action, remapped rows, NVLinks, ...) is injected into GPU i, as Inject
// does.
func (n *Node) InjectMIG(i, gi, ci int, s node.Signal) error {
	if i < 0 || i >= n.Len() {
		return fmt.Errorf("inject %s into GPU %d of %d: %w", s, i, n.Len(), ErrNoSuchGPU)
	}
	if !slices.ContainsFunc(n.MIGDevices(i), func(m MIGDevice) bool { return m.GI == gi && m.CI == ci }) {
		return fmt.Errorf("inject %s into GPU %d instance %d/%d: %w", s, i, gi, ci, ErrNoSuchMIGDevice)
	}
	return n.inject(i, s, uint32(gi), uint32(ci))
}

func (n *Node) inject(i int, s node.Signal, gi, ci uint32) error {
	var change func(*gpuFaults)
	var events []faultEvent
	event := func(t, data uint64) { events = append(events, faultEvent{GI: gi, CI: ci, Type: t, Data: data}) }
	switch s.Kind {
	case node.SignalXID, node.SignalDoubleBitECC:
		if s.Kind == node.SignalXID {
			event(nvml.EventTypeXidCriticalError, s.Value)
		} else {
			event(nvml.EventTypeDoubleBitEccError, 0)
		}
		ra, set := recoveryFor(s)
		change = func(f *gpuFaults) {
			if set && ra > f.RecoveryAction {
				f.RecoveryAction = ra
			}
			if s.Kind == node.SignalXID && s.Value == XIDFallenOffBus {
				f.Lost = true
			}
		}
	case node.SignalRecoveryAction:
		change = func(f *gpuFaults) { f.RecoveryAction = s.Value }
		event(nvml.EventTypeGpuRecoveryAction, s.Value)
		event(nvml.EventTypeXidCriticalError, xidRecoveryActionChanged)
	case node.SignalRowRemapPending:
		change = func(f *gpuFaults) { f.RowsPending = true }
	case node.SignalRowRemapFailed:
		change = func(f *gpuFaults) { f.RowsFailed = true }
	case node.SignalRetiredPagesPending:
		change = func(f *gpuFaults) { f.PagesPending = true }
	case node.SignalNVLinkDown:
		change = func(f *gpuFaults) {
			if !slices.Contains(f.LinksDown, int(s.Value)) {
				f.LinksDown = append(f.LinksDown, int(s.Value))
			}
		}
	case node.SignalNVLinkErrors:
		change = func(f *gpuFaults) { f.NVLinkErrors += max(s.Value, 1) }
	case node.SignalPCIeReplay:
		change = func(f *gpuFaults) { f.PCIeReplays += max(s.Value, 1) }
	case node.SignalThermalSlowdown:
		change = func(f *gpuFaults) { f.Thermal = true }
	case node.SignalPowerSlowdown:
		change = func(f *gpuFaults) { f.Power = true }
	case node.SignalLost:
		change = func(f *gpuFaults) { f.Lost = true }
		event(nvml.EventTypeXidCriticalError, XIDFallenOffBus)
	default:
		return fmt.Errorf("inject %s into GPU %d: unknown signal: %w", s, i, node.ErrInvalid)
	}
	if err := n.changeFaults(i, change, events...); err != nil {
		return fmt.Errorf("inject %s into GPU %d: %w", s, i, err)
	}
	return nil
}

// xidRecoveryActionChanged is the XID a driver reports when a GPU's
// recovery action changes.
const xidRecoveryActionChanged = 154

// Clear heals GPU i, as a reset would: the recovery action is none again,
// nothing is pending, its NVLinks are up, its clocks free and the GPU back
// on the bus (the NVLink error and PCIe replay counters keep their
// counts). With ShareFaults, in the tree.
func (n *Node) Clear(i int) error {
	if i < 0 || i >= n.Len() {
		return fmt.Errorf("clear GPU %d of %d: %w", i, n.Len(), ErrNoSuchGPU)
	}
	if err := n.changeFaults(i, func(f *gpuFaults) { *f = f.clear() }); err != nil {
		return fmt.Errorf("clear GPU %d: %w", i, err)
	}
	return nil
}

// healthCalls gives GPU device d (index i) the polled health calls,
// answered from its faults.
func (n *Node) healthCalls(d *mock.Device, i int) {
	d.GetFieldValuesFunc = func(values []nvml.FieldValue) nvml.Return {
		f := n.faultsOf(i)
		for k := range values {
			v := &values[k]
			if v.FieldId != nvml.FI_DEV_GET_GPU_RECOVERY_ACTION {
				v.NvmlReturn = uint32(nvml.ERROR_NOT_SUPPORTED)
				continue
			}
			v.ValueType, v.NvmlReturn = uint32(nvml.VALUE_TYPE_UNSIGNED_INT), uint32(nvml.SUCCESS)
			binary.NativeEndian.PutUint32(v.Value[:4], uint32(f.RecoveryAction))
		}
		return nvml.SUCCESS
	}
	d.GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) {
		f := n.faultsOf(i)
		return 0, 0, f.RowsPending, f.RowsFailed, nvml.SUCCESS
	}
	d.GetRetiredPagesPendingStatusFunc = func() (nvml.EnableState, nvml.Return) {
		if n.faultsOf(i).PagesPending {
			return nvml.FEATURE_ENABLED, nvml.SUCCESS
		}
		return nvml.FEATURE_DISABLED, nvml.SUCCESS
	}
	if up := d.GetNvLinkStateFunc; up != nil {
		d.GetNvLinkStateFunc = func(l int) (nvml.EnableState, nvml.Return) {
			state, ret := up(l)
			if ret == nvml.SUCCESS && slices.Contains(n.faultsOf(i).LinksDown, l) {
				state = nvml.FEATURE_DISABLED
			}
			return state, ret
		}
	}
	d.GetNvLinkErrorCounterFunc = func(l int, c nvml.NvLinkErrorCounter) (uint64, nvml.Return) {
		if _, ret := d.GetNvLinkStateFunc(l); ret != nvml.SUCCESS {
			return 0, ret
		}
		if l == 0 && c == nvml.NVLINK_ERROR_DL_REPLAY {
			return n.faultsOf(i).NVLinkErrors, nvml.SUCCESS
		}
		return 0, nvml.SUCCESS
	}
	d.GetPcieReplayCounterFunc = func() (int, nvml.Return) {
		return int(n.faultsOf(i).PCIeReplays), nvml.SUCCESS
	}
	d.GetCurrentClocksEventReasonsFunc = func() (uint64, nvml.Return) {
		f := n.faultsOf(i)
		var r uint64
		if f.Thermal {
			r |= nvml.ClocksEventReasonSwThermalSlowdown
		}
		if f.Power {
			r |= clocksPowerBrake
		}
		return r, nvml.SUCCESS
	}
}

// clocksPowerBrake is NVML's HW_POWER_BRAKE_SLOWDOWN clock-event reason.
const clocksPowerBrake = 0x80
