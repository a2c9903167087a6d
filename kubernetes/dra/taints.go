package dra

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/resourceclaim"

	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/attributes"
)

// TaintKeyName is the name part of the key of the taint an unhealthy
// device carries: "<driver>/unhealthy" (TaintKey).
const TaintKeyName = "unhealthy"

// TaintKey is the key of the taint an unhealthy device of driver carries:
// "gpu.gpuiso.io/unhealthy" for the default driver.
func TaintKey(driver string) string { return driver + "/" + TaintKeyName }

// NoExecuteXIDs returns the XIDs (with what each means) after which the work on a GPU is dead, or the
// GPU unusable until it is reset: a GPU marked unhealthy for one of them
// is tainted NoExecute, so that the cluster evicts the pods whose claims
// hold it. Every other XID that marks a GPU (an application's own XIDs
// never do, see nvmlnode.ApplicationXID) leaves it degraded: NoSchedule,
// no new claim gets it and the running ones go on. Among those: 63 (a
// row remap or page retirement recorded, applied at the next reset), 74
// (an NVLink error), 92 (a high single-bit ECC rate), 94 (a contained ECC
// error: the process that touched the memory was killed, others run on).
// The map is the caller's: a fresh copy on each call.
func NoExecuteXIDs() map[uint64]string {
	return map[uint64]string{
		48:  "double-bit ECC error",
		62:  "internal micro-controller halt",
		64:  "row remapping or page retirement failed",
		79:  "fallen off the bus",
		95:  "uncontained ECC error",
		119: "GSP RPC timeout",
		120: "GSP error",
	}
}

// noExecuteXID tells whether xid is one of NoExecuteXIDs.
func noExecuteXID(xid uint64) bool {
	_, ok := NoExecuteXIDs()[xid]
	return ok
}

var xidReason = regexp.MustCompile(`^xid[ _-]?([0-9]+)\b`)

// HealthTaint is HealthTaintOf(key, h, false): a device's taint on a node
// that does not reset its GPUs.
func HealthTaint(key string, h node.Health) (resourceapi.DeviceTaint, bool) {
	return HealthTaintOf(key, h, false)
}

// HealthTaintOf is the taint that health h gives a device, keyed key, and
// false for a healthy device; reset tells whether the node resets a GPU
// whose action is a reset (SliceOptions.EvictForReset). The value is a
// short form of h's reason.
//
// A reason the health monitor wrote (a node.Verdict's, "XID 109 (context
// switch timeout): reset-gpu") ends in the health table's action, and the
// effect follows it:
//
//	action                    reset off                 reset on
//	restart-app, drain        NoSchedule                NoSchedule
//	reset-gpu, reboot         NoExecute where the       NoExecute
//	                          work is dead (below),
//	                          else NoSchedule
//
// With the reset on, the claims of a GPU waiting for its reset are
// evicted, so that it can be reset and given back; a GPU whose reset
// failed (action reboot) keeps its NoExecute taint. Without it, a reset
// or a reboot evicts them only after a signal that leaves the work on the
// GPU dead. That, the value, and the effect of a reason no verdict wrote
// (an operator's) follow the reason's start:
//
//	reason                                     value            effect
//	"XID <n>", n in NoExecuteXIDs               xid-<n>          NoExecute
//	"XID <n>", any other n                      xid-<n>          NoSchedule
//	"double-bit ECC error"                      ecc-double-bit   NoExecute
//	"GPU is lost" (fallen off the bus)          gpu-lost         NoExecute
//	anything else (an operator's reason)        the reason as a  NoSchedule
//	                                            label value, or
//	                                            "unhealthy"
//
// Reasons are read without regard to case. A healthy device with a reason
// (a signal noted on a device that stays in service, allocator.Inform:
// XID 94, a contained ECC error whose fix is restarting the application;
// a thermal slowdown) carries a taint of effect None with the value the
// reason gives: shown, never keeping a claim from it.
func HealthTaintOf(key string, h node.Health, reset bool) (resourceapi.DeviceTaint, bool) {
	if h.Healthy && strings.TrimSpace(h.Reason) == "" {
		return resourceapi.DeviceTaint{}, false
	}
	value, effect := taintOf(h.Reason)
	switch a, ok := node.VerdictAction(h.Reason); {
	case h.Healthy:
		effect = resourceapi.DeviceTaintEffectNone
	case !ok:
	case a == node.ActionResetGPU || a == node.ActionReboot:
		if reset {
			effect = resourceapi.DeviceTaintEffectNoExecute
		}
	default:
		effect = resourceapi.DeviceTaintEffectNoSchedule
	}
	return resourceapi.DeviceTaint{Key: key, Value: value, Effect: effect}, true
}

func taintOf(reason string) (string, resourceapi.DeviceTaintEffect) {
	r := strings.ToLower(strings.TrimSpace(reason))
	if m := xidReason.FindStringSubmatch(r); m != nil {
		if xid, err := strconv.ParseUint(m[1], 10, 64); err == nil {
			if noExecuteXID(xid) {
				return "xid-" + m[1], resourceapi.DeviceTaintEffectNoExecute
			}
			return "xid-" + m[1], resourceapi.DeviceTaintEffectNoSchedule
		}
	}
	switch {
	case strings.Contains(r, "double-bit ecc"):
		return "ecc-double-bit", resourceapi.DeviceTaintEffectNoExecute
	case strings.Contains(r, "gpu is lost") || strings.Contains(r, "fallen off the bus"):
		return "gpu-lost", resourceapi.DeviceTaintEffectNoExecute
	}
	if v := attributes.LabelValue(r); v != "" {
		return v, resourceapi.DeviceTaintEffectNoSchedule
	}
	return TaintKeyName, resourceapi.DeviceTaintEffectNoSchedule
}

// taints are the taints of a device whose health (and, for a MIG device,
// its parent's) is hs: one per unhealthy one, none twice. None when
// o.TaintKey is empty.
func (o SliceOptions) taints(hs ...node.Health) []resourceapi.DeviceTaint {
	if o.TaintKey == "" {
		return nil
	}
	var out []resourceapi.DeviceTaint
	for _, h := range hs {
		if t, ok := HealthTaintOf(o.TaintKey, h, o.EvictForReset); ok && !slices.Contains(out, t) {
			out = append(out, t)
		}
	}
	return out
}

// HeldTaintKeyName is the name part of the key of the taint a device held
// for an owner that is no claim of the driver's carries:
// "<driver>/held" (HeldTaint).
const HeldTaintKeyName = "held"

// HeldTaint is the taint of a device that the allocator holds for an
// owner that is no claim of the driver's (a pod of the device plugin, a
// program of the node's): key "<driver>/held", in the domain of taintKey
// (the health taints' key, TaintKey), value "held", effect NoSchedule. The
// scheduler allocates such a device to no claim that does not tolerate
// it, where Prepare would refuse it; running claims are left alone.
func HeldTaint(taintKey string) resourceapi.DeviceTaint {
	domain, _, _ := strings.Cut(taintKey, "/")
	return resourceapi.DeviceTaint{Key: domain + "/" + HeldTaintKeyName, Value: "held", Effect: resourceapi.DeviceTaintEffectNoSchedule}
}

// heldTaints are the taints of the device uuid for being held by an owner
// that is no claim of the driver's: HeldTaint, or none.
func (o SliceOptions) heldTaints(uuid string) []resourceapi.DeviceTaint {
	if o.TaintKey == "" || uuid == "" || !o.held[uuid] {
		return nil
	}
	return []resourceapi.DeviceTaint{HeldTaint(o.TaintKey)}
}

// heldElsewhere are the devices (GPUs, MIG devices, by UUID) that the
// allocator holds for owners that are no claim of the driver's.
func (d *Driver) heldElsewhere() map[string]bool {
	var held map[string]bool
	for _, al := range d.alloc.Allocations() {
		if _, ok := claimOf(al.Owner); ok {
			continue
		}
		for _, r := range al.Devices {
			if held == nil {
				held = map[string]bool{}
			}
			held[r.UUID] = true
		}
	}
	return held
}

// untolerated is the first taint of taints, of an effect that keeps a
// device from a claim (NoSchedule, NoExecute), that no toleration of tols
// tolerates.
func untolerated(taints []resourceapi.DeviceTaint, tols []resourceapi.DeviceToleration) (resourceapi.DeviceTaint, bool) {
	for _, t := range taints {
		if t.Effect != resourceapi.DeviceTaintEffectNoSchedule && t.Effect != resourceapi.DeviceTaintEffectNoExecute {
			continue
		}
		if !slices.ContainsFunc(tols, func(tol resourceapi.DeviceToleration) bool { return resourceclaim.ToleratesTaint(tol, t) }) {
			return t, true
		}
	}
	return resourceapi.DeviceTaint{}, false
}

// deviceTolerations are the tolerations a claim's allocation recorded
// for one device (DeviceRequestAllocationResult.Tolerations).
type deviceTolerations = []resourceapi.DeviceToleration

// tolerated are the UUIDs of cp's devices (admin ones aside) that are
// unhealthy now and whose every taint the claim tolerates: those the
// allocator is asked to hand out although unhealthy
// (allocator.Request.AcceptUnhealthy). A device unhealthy and not
// tolerated is an ErrUntolerated, and so is every unhealthy device when
// the driver publishes no taints (Config.LeaveOutUnhealthy).
func (d *Driver) tolerated(cp *Checkpoint) ([]string, error) {
	health := map[string][]node.Health{} // by UUID: the device's, then its parent's
	for _, dev := range d.alloc.Devices() {
		health[dev.UUID] = []node.Health{dev.Health}
		for _, m := range dev.MIGDevices {
			health[m.UUID] = []node.Health{m.Health, dev.Health}
		}
	}
	var accept []string
	for _, pd := range cp.Devices {
		hs := health[pd.UUID]
		if pd.Admin || !slices.ContainsFunc(hs, func(h node.Health) bool { return !h.Healthy }) {
			continue
		}
		taints := d.cfg.Slice.taints(hs...)
		if len(taints) == 0 {
			return nil, fmt.Errorf("device %s: %s: %w", pd.Device, hs[0], ErrUntolerated)
		}
		if t, ok := untolerated(taints, pd.tolerations); ok {
			return nil, fmt.Errorf("device %s: its taint %s=%s:%s is not tolerated: %w", pd.Device, t.Key, t.Value, t.Effect, ErrUntolerated)
		}
		accept = append(accept, pd.UUID)
	}
	return accept, nil
}
