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

// applicationXIDs are the XIDs that an application's own faults raise
// (graphics engine exception, MMU fault, reset channel, preemptive cleanup,
// video processor exception, ...): they leave the GPU healthy.
var applicationXIDs = [...]uint64{13, 31, 43, 45, 68, 109}

// ApplicationXID tells whether xid is an application error that leaves the
// GPU healthy (13, 31, 43, 45, 68, 109).
func ApplicationXID(xid uint64) bool { return slices.Contains(applicationXIDs[:], xid) }

// Target is what the monitor marks: an allocator, in practice.
type Target interface {
	// Devices are the GPUs to watch, as they are now.
	Devices() []node.Device
	// MarkUnhealthy stops a GPU, or one MIG device of a GPU (by "GPU-" or
	// "MIG-" UUID), from being handed out and returns its owners.
	MarkUnhealthy(ctx context.Context, device, reason string) ([]string, error)
}

// HealthEvent is what the monitor saw and did.
type HealthEvent struct {
	// Device is the GPU, as it is now (unhealthy, unless MIG is set).
	Device node.Device
	// MIG, when set, is the MIG device of Device that the driver named as
	// the event's source: it alone is marked unhealthy.
	MIG *node.MIGDevice
	// XID is the XID error, or 0 for a double-bit ECC error.
	XID uint64
	// Owners are those holding the GPU: their containers are affected.
	Owners []string
	// Err is set when the event could not be acted on (the device stays as
	// it was).
	Err error
}

// monitorPoll is how long one NVML wait lasts, bounding how long
// cancellation takes to be noticed.
const monitorPoll = 100 * time.Millisecond

// Monitor watches lib's XID critical-error and double-bit ECC events for
// the node's GPUs until ctx is done. An event that is not an application
// XID marks the GPU unhealthy (so it is not handed out again until
// MarkHealthy) and is reported to notify with the GPU's owners. A GPU
// found lost (fallen off the bus) when the monitor starts or while it waits
// is handled the same way. NVML is initialised for the monitor's lifetime.
// A GPU that cannot be watched is reported to notify as an event with only
// Err set; the monitor fails only when none can be watched. It returns ctx's error when ctx
// ends.
func Monitor(ctx context.Context, lib nvml.Interface, target Target, notify func(HealthEvent)) error {
	if lib == nil || target == nil || notify == nil {
		return fmt.Errorf("monitor: nil NVML, target or callback: %w", node.ErrInvalid)
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

	// mark marks GPU p unhealthy and tells the caller.
	devices := target.Devices()
	mark := func(p int, xid uint64, reason string) {
		owners, err := target.MarkUnhealthy(ctx, devices[p].UUID, reason)
		dev := devices[p].Clone()
		if err == nil {
			dev.Health = node.Unhealthy(reason)
		}
		notify(HealthEvent{Device: dev, XID: xid, Owners: owners, Err: err})
	}
	// markMIG marks MIG device m of GPU p unhealthy and tells the caller.
	markMIG := func(p int, m node.MIGDevice, xid uint64, reason string) {
		owners, err := target.MarkUnhealthy(ctx, m.UUID, reason)
		if err == nil {
			m.Health = node.Unhealthy(reason)
		}
		notify(HealthEvent{Device: devices[p].Clone(), MIG: &m, XID: xid, Owners: owners, Err: err})
	}
	handles := make([]nvml.Device, len(devices))
	var problems []error
	watched, gone := 0, 0
	for p, d := range devices {
		h, ret := handle(lib, d)
		if ret == nvml.SUCCESS {
			types := uint64(nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError)
			if ret = h.RegisterEvents(types, set); ret != nvml.SUCCESS && ret != nvml.ERROR_GPU_IS_LOST {
				ret = h.RegisterEvents(nvml.EventTypeXidCriticalError, set)
			}
		}
		switch ret {
		case nvml.SUCCESS:
			handles[p] = h
			watched++
		case nvml.ERROR_GPU_IS_LOST:
			gone++
			if d.Health.Healthy {
				mark(p, 0, ErrGPULost.Error())
			}
		default:
			problems = append(problems, nvmlError("watch events", d.Index, ret))
		}
	}
	if watched == 0 && gone < len(devices) {
		return fmt.Errorf("monitor: no GPU can be watched: %w", errors.Join(problems...))
	}
	for _, err := range problems {
		notify(HealthEvent{Err: err})
	}
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		e, ret := set.Wait(uint32(monitorPoll / time.Millisecond))
		switch ret {
		case nvml.SUCCESS:
		case nvml.ERROR_TIMEOUT:
			continue
		case nvml.ERROR_GPU_IS_LOST:
			// A watched GPU fell off the bus without saying which: ask
			// each, and stop watching the lost ones.
			for p, h := range handles {
				if h == nil {
					continue
				}
				if _, ret := h.GetUUID(); ret == nvml.ERROR_GPU_IS_LOST {
					handles[p] = nil
					mark(p, 0, ErrGPULost.Error())
				}
			}
			continue
		default:
			if err := ctx.Err(); err != nil {
				return err
			}
			return fmt.Errorf("monitor: %w", nvmlError("wait for events", -1, ret))
		}
		p := slices.IndexFunc(handles, func(h nvml.Device) bool { return h != nil && sameDevice(h, e.Device) })
		if p < 0 {
			continue
		}
		xid := e.EventData
		var reason string
		switch {
		case e.EventType&nvml.EventTypeXidCriticalError != 0:
			if ApplicationXID(xid) {
				continue
			}
			reason = fmt.Sprintf("XID %d", xid)
		case e.EventType&nvml.EventTypeDoubleBitEccError != 0:
			xid, reason = 0, "double-bit ECC error"
		default:
			continue
		}
		// The target's MIG devices as they are now: a MIG device made
		// since the monitor started (dynamic MIG) is one of them.
		if migs := migSources(target.Devices()[p], e); len(migs) > 0 {
			for _, m := range migs {
				markMIG(p, m, xid, reason)
			}
			continue
		}
		mark(p, xid, reason)
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
