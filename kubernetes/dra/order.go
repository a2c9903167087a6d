package dra

import (
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"
)

// PreferredOrder orders the devices of a slice for the scheduler, whose
// allocator takes the first devices of a slice that fit a request (first
// fit, in slice order). That is how a claim the scheduler writes for a
// pod's resources.limits (an extended resource served by a DeviceClass,
// KEP-5004) gets NVLinked GPUs: such a claim is a plain count of the
// class's devices and carries no matchAttribute constraint. So the whole
// GPUs of an NVLink clique (AttrNVLinkClique) come together, the clique
// with the most free GPUs first (ties in slice order), its free GPUs
// before the busy ones: a request for n GPUs gets n of one clique
// whenever a clique has n free. GPUs in no clique follow, then every
// other device, each group in its order. busy tells a GPU that is held
// (by its index, AttrIndex; a GPU one of whose MIG devices is held is
// busy too) or tainted; the devices are not changed, only their order.
func PreferredOrder(devs []resourceapi.Device, busy func(index int64) bool) []resourceapi.Device {
	type clique struct {
		name       string
		free, held []resourceapi.Device
	}
	var cliques []*clique
	var loose, other []resourceapi.Device
	for _, dev := range devs {
		a := dev.Attributes
		if t := a[AttrType].StringValue; t == nil || *t != "gpu" {
			other = append(other, dev)
			continue
		}
		c := a[AttrNVLinkClique].StringValue
		if c == nil {
			loose = append(loose, dev)
			continue
		}
		i := slices.IndexFunc(cliques, func(q *clique) bool { return q.name == *c })
		if i < 0 {
			cliques = append(cliques, &clique{name: *c})
			i = len(cliques) - 1
		}
		idx := a[AttrIndex].IntValue
		if len(dev.Taints) > 0 || idx != nil && busy(*idx) {
			cliques[i].held = append(cliques[i].held, dev)
		} else {
			cliques[i].free = append(cliques[i].free, dev)
		}
	}
	slices.SortStableFunc(cliques, func(a, b *clique) int { return len(b.free) - len(a.free) })
	out := make([]resourceapi.Device, 0, len(devs))
	for _, c := range cliques {
		out = append(append(out, c.free...), c.held...)
	}
	return append(append(out, loose...), other...)
}

// preferred orders the devices of each of the pool's slices
// (PreferredOrder), the GPUs the allocator holds now being busy.
func (d *Driver) preferred(pool []resourceslice.Slice) []resourceslice.Slice {
	held := map[int64]bool{}
	for _, al := range d.alloc.Allocations() {
		for _, r := range al.Devices {
			held[int64(r.Index)] = true
		}
	}
	busy := func(i int64) bool { return held[i] }
	for i := range pool {
		pool[i].Devices = PreferredOrder(pool[i].Devices, busy)
	}
	return pool
}
