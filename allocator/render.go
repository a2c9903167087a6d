package allocator

import (
	"math/bits"
	"strconv"
	"strings"

	"github.com/gpuiso/gpuiso/node"
)

// allocation renders what owner holds as the Allocation callers see: its
// devices (whole GPUs in inventory order, its MIG devices, or the one GPU
// it shares) and the environment its container gets: NVIDIA_VISIBLE_DEVICES
// naming every device and, for a memory share, the MPS client limits.
func (a *Allocator) allocation(owner string, h *holding) Allocation {
	al := Allocation{Owner: owner, Group: h.group}
	if h.holder != nil {
		hh := *h.holder
		al.Holder = &hh
	}
	if len(h.mig) > 0 {
		al.Devices = a.migRefs(h.mig)
	} else if h.shared >= 0 {
		al.Share = &Share{Mode: h.mode, MemoryBytes: h.memory, ComputePercent: h.compute}
		al.Shared = h.mode == ShareMemory
		if al.Shared {
			al.MemoryBytes = h.memory
		}
		al.Devices = []node.DeviceRef{a.inv.Devices[h.shared].Ref()}
	} else {
		al.Devices = make([]node.DeviceRef, 0, bits.OnesCount64(h.devices))
		for m := h.devices; m != 0; m &= m - 1 {
			al.Devices = append(al.Devices, a.inv.Devices[bits.TrailingZeros64(m)].Ref())
		}
	}
	var visible strings.Builder
	for i, d := range al.Devices {
		if i > 0 {
			visible.WriteByte(',')
		}
		if d.UUID != "" {
			visible.WriteString(d.UUID)
		} else {
			visible.WriteString(strconv.Itoa(d.Index))
		}
	}
	al.Env = map[string]string{"NVIDIA_VISIBLE_DEVICES": visible.String()}
	if al.Shared {
		mib := max(h.memory>>20, 1)
		al.Env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = "0=" + strconv.FormatUint(mib, 10) + "M"
		if h.compute > 0 {
			al.Env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = strconv.Itoa(h.compute)
		}
	}
	return al
}
