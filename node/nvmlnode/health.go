package nvmlnode

import (
	"encoding/binary"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuiso/gpuiso/node"
)

// Clock-event reasons that tell a slowdown for heat or power (NVML's
// nvmlClocksEventReason bits): software and hardware thermal slowdown, and
// the hardware power brake. A software power cap is a GPU at work, not a
// fault.
const (
	clocksThermal = 0x20 | 0x40 // SW_THERMAL_SLOWDOWN | HW_THERMAL_SLOWDOWN
	clocksPower   = 0x80        // HW_POWER_BRAKE_SLOWDOWN
)

// Reading is what one read of a GPU's polled health signals found.
type Reading struct {
	// Conditions are the signals that hold now: the driver's recovery
	// action when it is not none, row remapping pending or failed, page
	// retirement pending, a slowdown for heat or power, or the GPU lost
	// (then alone).
	Conditions []node.Signal
	// RecoveryAction is the driver's recovery action
	// (node.RecoveryNone, ...), when RecoveryKnown.
	RecoveryAction uint64
	// RecoveryKnown is false where the driver does not give a recovery
	// action (drivers before 565).
	RecoveryKnown bool
	// LinksUp are the NVLinks that are up.
	LinksUp []int
	// NVLinkErrors is the sum of the error counters of every link
	// (replay, recovery, CRC, ECC), and PCIeReplays the PCIe replay
	// counter: they only grow, so a caller compares two readings.
	NVLinkErrors, PCIeReplays uint64
	// Lost is set when the GPU fell off the bus.
	Lost bool
}

// Holds tells whether the reading holds a condition of kind k.
func (r Reading) Holds(k node.SignalKind) bool {
	return slices.ContainsFunc(r.Conditions, func(s node.Signal) bool { return s.Kind == k })
}

// ReadHealth reads the polled health signals of GPU dev, without DCGM:
// NVML's recovery-action field, remapped rows, pending retired pages,
// NVLink states and error counters, the PCIe replay counter and the clock
// event reasons. A signal the GPU or driver does not give is left out; a
// GPU that answers ERROR_GPU_IS_LOST gives a reading with Lost set and a
// SignalLost condition.
func ReadHealth(dev nvml.Device) Reading {
	var r Reading
	lost := func(ret nvml.Return) bool {
		if ret == nvml.ERROR_GPU_IS_LOST {
			r = Reading{Lost: true, Conditions: []node.Signal{{Kind: node.SignalLost}}}
			return true
		}
		return false
	}
	fv := []nvml.FieldValue{{FieldId: nvml.FI_DEV_GET_GPU_RECOVERY_ACTION}}
	ret := nvml.ERROR_NOT_SUPPORTED
	guard(func() { ret = dev.GetFieldValues(fv) })
	if lost(ret) {
		return r
	}
	if ret == nvml.SUCCESS && nvml.Return(fv[0].NvmlReturn) == nvml.SUCCESS {
		r.RecoveryAction, r.RecoveryKnown = fieldUint(fv[0]), true
		if r.RecoveryAction != node.RecoveryNone {
			r.Conditions = append(r.Conditions, node.Signal{Kind: node.SignalRecoveryAction, Value: r.RecoveryAction})
		}
	}
	var pending, failed bool
	ret = nvml.ERROR_NOT_SUPPORTED
	guard(func() { _, _, pending, failed, ret = dev.GetRemappedRows() })
	if lost(ret) {
		return r
	}
	if ret == nvml.SUCCESS {
		if pending {
			r.Conditions = append(r.Conditions, node.Signal{Kind: node.SignalRowRemapPending})
		}
		if failed {
			r.Conditions = append(r.Conditions, node.Signal{Kind: node.SignalRowRemapFailed})
		}
	}
	var pages nvml.EnableState
	ret = nvml.ERROR_NOT_SUPPORTED
	guard(func() { pages, ret = dev.GetRetiredPagesPendingStatus() })
	if lost(ret) {
		return r
	}
	if ret == nvml.SUCCESS && pages == nvml.FEATURE_ENABLED {
		r.Conditions = append(r.Conditions, node.Signal{Kind: node.SignalRetiredPagesPending})
	}
	for link := range nvml.NVLINK_MAX_LINKS {
		var state nvml.EnableState
		ret := nvml.ERROR_NOT_SUPPORTED
		guard(func() { state, ret = dev.GetNvLinkState(link) })
		if lost(ret) {
			return r
		}
		if ret != nvml.SUCCESS {
			continue
		}
		if state == nvml.FEATURE_ENABLED {
			r.LinksUp = append(r.LinksUp, link)
		}
		for c := nvml.NVLINK_ERROR_DL_REPLAY; c <= nvml.NVLINK_ERROR_DL_ECC_DATA; c++ {
			guard(func() {
				if n, ret := dev.GetNvLinkErrorCounter(link, c); ret == nvml.SUCCESS {
					r.NVLinkErrors += n
				}
			})
		}
	}
	var replays int
	ret = nvml.ERROR_NOT_SUPPORTED
	guard(func() { replays, ret = dev.GetPcieReplayCounter() })
	if lost(ret) {
		return r
	}
	if ret == nvml.SUCCESS && replays > 0 {
		r.PCIeReplays = uint64(replays)
	}
	var reasons uint64
	ret = nvml.ERROR_NOT_SUPPORTED
	guard(func() { reasons, ret = dev.GetCurrentClocksEventReasons() })
	if lost(ret) {
		return r
	}
	if ret == nvml.SUCCESS {
		if reasons&clocksThermal != 0 {
			r.Conditions = append(r.Conditions, node.Signal{Kind: node.SignalThermalSlowdown})
		}
		if reasons&clocksPower != 0 {
			r.Conditions = append(r.Conditions, node.Signal{Kind: node.SignalPowerSlowdown})
		}
	}
	return r
}

// guard runs call, taking a panic for a call the device does not
// answer: a test double (go-nvml's mocks) panics on a call it was not
// given, where a driver would answer ERROR_NOT_SUPPORTED.
func guard(call func()) {
	defer func() { _ = recover() }()
	call()
}

// fieldUint is an NVML field value as an unsigned number.
func fieldUint(v nvml.FieldValue) uint64 {
	switch nvml.ValueType(v.ValueType) {
	case nvml.VALUE_TYPE_UNSIGNED_INT, nvml.VALUE_TYPE_SIGNED_INT:
		return uint64(binary.NativeEndian.Uint32(v.Value[:4]))
	case nvml.VALUE_TYPE_UNSIGNED_SHORT:
		return uint64(binary.NativeEndian.Uint16(v.Value[:2]))
	default:
		return binary.NativeEndian.Uint64(v.Value[:])
	}
}

// changes are the signals that reading now gives against earlier ones of
// the same GPU: the NVLinks up in base (the first reading) and down now,
// conditions while they last, and the rise of the NVLink error and PCIe
// replay counters since prev, events.
func changes(base, prev, now Reading) (conditions, events []node.Signal) {
	if now.Lost {
		return nil, nil
	}
	for _, l := range base.LinksUp {
		if !slices.Contains(now.LinksUp, l) {
			conditions = append(conditions, node.Signal{Kind: node.SignalNVLinkDown, Value: uint64(l)})
		}
	}
	if prev.Lost {
		return conditions, nil
	}
	if now.NVLinkErrors > prev.NVLinkErrors {
		events = append(events, node.Signal{Kind: node.SignalNVLinkErrors, Value: now.NVLinkErrors - prev.NVLinkErrors})
	}
	if now.PCIeReplays > prev.PCIeReplays {
		events = append(events, node.Signal{Kind: node.SignalPCIeReplay, Value: now.PCIeReplays - prev.PCIeReplays})
	}
	return conditions, events
}
