package allocator

import (
	"math/bits"
	"strconv"

	"github.com/gpuiso/gpuiso/node"
)

// allocation renders what owner holds as the Allocation callers see: its
// devices (whole GPUs in inventory order, its MIG devices, or the one GPU
// it shares). The environment that names them is the isolation plan's
// (isolator.NewPlan), and so are a memory share's MPS client limits
// (isolator.WithShare).
func (a *Allocator) allocation(owner string, h *holding) Allocation {
	al := Allocation{Owner: owner, Group: h.group}
	if h.holder != nil {
		hh := *h.holder
		al.Holder = &hh
	}
	k, migShare := h.migShare()
	if len(h.mig) > 0 {
		al.Devices = a.migRefs(h.mig)
	} else if h.shared >= 0 || migShare {
		al.Share = &Share{Mode: h.mode, MemoryBytes: h.memory, ComputePercent: h.compute, Slices: h.slices}
		al.Shared = h.mode == ShareMemory
		if al.Shared {
			al.MemoryBytes = h.memory
		}
		if migShare {
			al.Devices = a.migRefs([]int{k})
		} else {
			al.Devices = []node.DeviceRef{a.inv.Devices[h.shared].Ref()}
		}
	} else {
		al.Devices = make([]node.DeviceRef, 0, bits.OnesCount64(h.devices))
		for m := h.devices; m != 0; m &= m - 1 {
			al.Devices = append(al.Devices, a.inv.Devices[bits.TrailingZeros64(m)].Ref())
		}
	}
	return al
}

// ClientEnv is what the container of memory share s must carry, sorted
// ("KEY=value"): the MPS client limits CUDA_MPS_PINNED_DEVICE_MEM_LIMIT
// (and CUDA_MPS_ACTIVE_THREAD_PERCENTAGE with a compute percentage). A
// client can only lower these below its MPS control daemon's; the
// daemon's are what holds (see package isolator/mps). A time slice needs
// none.
//
// Deprecated: the share's MPS daemon carries its limits (mps.LimitsOf,
// mps.Limits.Env), and isolator.WithShare puts them in the plan's
// environment.
func (s Share) ClientEnv() []string {
	if s.mode() != ShareMemory {
		return nil
	}
	var env []string
	if s.ComputePercent > 0 {
		env = append(env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="+strconv.Itoa(s.ComputePercent))
	}
	mib := max(s.MemoryBytes>>20, 1)
	return append(env, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0="+strconv.FormatUint(mib, 10)+"M")
}
