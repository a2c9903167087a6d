package allocator

import (
	"fmt"
)

// checkInvariants verifies the allocator's internal consistency: every GPU
// held once, per-device views agreeing with per-owner ones, shares within
// memory and never beside an exclusive owner, one kind of share per GPU,
// and concurrent slices of one count N, at most N of them, each with its
// part of the GPU's memory.
func (a *Allocator) checkInvariants() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	var seen uint64
	for o, h := range a.owners {
		if h.devices&seen != 0 {
			return fmt.Errorf("owner %s: device held twice", o)
		}
		seen |= h.devices
		for _, p := range a.positions(h.devices) {
			if a.exclusive[p] != o {
				return fmt.Errorf("owner %s holds %s but the device says %q", o, a.name(p), a.exclusive[p])
			}
		}
		if h.shared >= 0 {
			if h.devices != 0 {
				return fmt.Errorf("owner %s holds both shares and whole GPUs", o)
			}
			if a.shares[h.shared][o] != h.memory {
				return fmt.Errorf("owner %s share mismatch", o)
			}
			if err := (Share{Mode: h.mode, MemoryBytes: h.memory, ComputePercent: h.compute, Slices: h.slices}).Validate(); err != nil || h.mode == "" {
				return fmt.Errorf("owner %s holds a share of mode %q: %v", o, h.mode, err)
			}
			if h.mode == ShareSlice && h.memory != a.sliceMemory(h.shared, h.slices) {
				return fmt.Errorf("owner %s holds a slice of %d of %d bytes, not the gpu's part", o, h.slices, h.memory)
			}
		} else if _, migShare := h.migShare(); h.devices == 0 && len(h.mig) == 0 && !migShare {
			return fmt.Errorf("owner %s holds nothing", o)
		}
	}
	for p := range a.n {
		if a.exclusive[p] != "" {
			if h := a.owners[a.exclusive[p]]; h == nil || h.devices&(1<<p) == 0 {
				return fmt.Errorf("%s owned by unknown %s", a.name(p), a.exclusive[p])
			}
			if len(a.shares[p]) > 0 {
				return fmt.Errorf("%s both exclusive and shared", a.name(p))
			}
		}
		var used uint64
		var mode ShareMode
		held, count := 0, 0
		for o, m := range a.shares[p] {
			h := a.owners[o]
			if h == nil || h.shared != p {
				return fmt.Errorf("%s shared by unknown %s", a.name(p), o)
			}
			if mode != "" && h.mode != mode {
				return fmt.Errorf("%s held by both %s and %s shares", a.name(p), mode, h.mode)
			}
			mode = h.mode
			used += m
			if h.mode == ShareSlice {
				if held > 0 && h.slices != count {
					return fmt.Errorf("%s split in both %d and %d slices", a.name(p), count, h.slices)
				}
				held, count = held+1, h.slices
			}
		}
		if held > count {
			return fmt.Errorf("%s holds %d slices of %d", a.name(p), held, count)
		}
		if used > a.inv.Devices[p].MemoryBytes {
			return fmt.Errorf("%s shares %d bytes of %d", a.name(p), used, a.inv.Devices[p].MemoryBytes)
		}
	}
	return a.checkMIGInvariants()
}
