package dra

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"

	"github.com/gpuiso/gpuiso/node"
)

// The attributes of a dynamic MIG device (a placement of a GPU that
// SliceOptions.DynamicMIG names), beside type "mig", profile and
// parentUUID: where the GPU instance goes, in the GPU's memory slices.
const (
	AttrPlacementStart = "placementStart"
	AttrPlacementSize  = "placementSize"
)

// The counters of a GPU partitioned by dynamic MIG, in its counter set
// (CounterSetName): one per memory slice ("memory-slice-<k>", 1 each), its
// compute slices, and for a profile of which the GPU holds fewer instances
// than it has placements ("1g.10gb+me": one of seven), their number
// ("profile-<id>").
const (
	CounterMemorySlice   = "memory-slice-"
	CounterComputeSlices = "compute-slices"
	CounterProfile       = "profile-"
)

// Limits of a ResourceSlice of resource.k8s.io/v1 (Kubernetes 1.37): a
// slice holds devices or counter sets, never both; at most 8 counter sets,
// 32 counters in each; at most 128 devices, 64 when one of them consumes
// counters or has taints.
const (
	maxCounterSets         = resourceapi.ResourceSliceMaxCounterSets
	maxCounters            = resourceapi.ResourceSliceMaxCountersPerCounterSet
	maxDevices             = resourceapi.ResourceSliceMaxDevices
	maxDevicesWithCounters = resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures
)

// CounterSetName is the name of the counter set of GPU d: "gpu-<index>".
func CounterSetName(d node.Device) string { return "gpu-" + strconv.Itoa(d.Index) }

// PlacementDeviceName is the name of the dynamic MIG device of profile at
// memory slice start of GPU d: "mig-<index>-<profile>-<start>", the
// profile with '.' and '+' as '-' ("mig-0-1g-10gb-3").
func PlacementDeviceName(d node.Device, profile string, start int) string {
	p := strings.NewReplacer(".", "-", "+", "-").Replace(strings.ToLower(profile))
	return fmt.Sprintf("mig-%d-%s-%d", d.Index, p, start)
}

// placement is one place a GPU instance of a profile may take on a GPU.
type placement struct {
	profile node.MIGProfile
	at      node.MIGPlacement
}

// placements are every placement of every MIG profile of d, in profile
// order.
func placements(d node.Device) []placement {
	var out []placement
	for _, p := range d.MIGProfiles {
		for _, at := range p.Placements {
			out = append(out, placement{p, at})
		}
	}
	return out
}

// migShape is what GPU d has of memory slices (one past the last
// placement's end) and compute slices (the largest profile's).
func migShape(d node.Device) (memSlices, compute int) {
	for _, p := range d.MIGProfiles {
		compute = max(compute, p.Slices)
		for _, at := range p.Placements {
			memSlices = max(memSlices, at.Start+at.Size)
		}
	}
	return memSlices, compute
}

// partitioned tells whether GPU d is partitioned by dynamic MIG: MIG
// enabled, named in opts.DynamicMIG, with profiles whose counters fit a
// counter set.
func (o SliceOptions) partitioned(d node.Device) bool {
	if !d.MIGSplit() || d.UUID == "" || !slices.Contains(o.DynamicMIG, d.UUID) {
		return false
	}
	mem, compute := migShape(d)
	return mem > 0 && compute > 0 && len(counters(d, nil)) <= maxCounters
}

// staticMIG are d's MIG devices that the driver did not make (a user's):
// they stay as they are, published as MIG devices of their own, and the
// placements they overlap are not published.
func (o SliceOptions) staticMIG(d node.Device) []node.MIGDevice {
	var out []node.MIGDevice
	for _, m := range d.MIGDevices {
		if !o.made[m.UUID] {
			out = append(out, m)
		}
	}
	return out
}

// counters are GPU d's counters with what static takes away: a memory
// slice a static instance covers is not there; compute slices and the
// count of a limited profile are lessened by theirs.
func counters(d node.Device, static []node.MIGDevice) map[string]resourceapi.Counter {
	mem, compute := migShape(d)
	out := map[string]resourceapi.Counter{}
	taken := make([]bool, mem)
	for _, m := range static {
		for k := m.Placement.Start; k < m.Placement.Start+m.Placement.Size && k < mem; k++ {
			taken[k] = true
		}
		if p, ok := d.MIGProfile(m.Profile); ok {
			compute -= p.Slices
		}
	}
	for k := range mem {
		if !taken[k] {
			out[CounterMemorySlice+strconv.Itoa(k)] = counter(1)
		}
	}
	out[CounterComputeSlices] = counter(int64(max(compute, 0)))
	for _, p := range d.MIGProfiles {
		if p.Count >= len(p.Placements) {
			continue
		}
		n := p.Count
		for _, m := range static {
			if m.Profile == p.Name {
				n--
			}
		}
		out[CounterProfile+strconv.Itoa(p.ID)] = counter(int64(max(n, 0)))
	}
	return out
}

func counter(v int64) resourceapi.Counter {
	return resourceapi.Counter{Value: *resource.NewQuantity(v, resource.DecimalSI)}
}

// consumption is what an instance of p at at takes of GPU d's counters.
func consumption(d node.Device, p node.MIGProfile, at node.MIGPlacement) map[string]resourceapi.Counter {
	out := map[string]resourceapi.Counter{CounterComputeSlices: counter(int64(p.Slices))}
	for k := at.Start; k < at.Start+at.Size; k++ {
		out[CounterMemorySlice+strconv.Itoa(k)] = counter(1)
	}
	if p.Count < len(p.Placements) {
		out[CounterProfile+strconv.Itoa(p.ID)] = counter(1)
	}
	return out
}

// partitionDevices are the devices of GPU d partitioned by dynamic MIG:
// its static MIG devices as they are (staticMIG, no counters), every
// placement of every profile that no static instance overlaps, and,
// while it has no static instance, the GPU whole; the placements and the
// whole GPU consume d's counters (CounterSetName), so that the scheduler
// allocates at most one of any overlapping set. A placement's device has
// no uuid: its MIG device is made when a claim allocated it is prepared.
// An unhealthy GPU's devices carry the taints of opts.TaintKey (so that
// the pods of a MIG device made on it are evicted where the taint says
// so; a tolerating claim of a placement is still refused by Prepare, as
// no MIG device is made on an unhealthy GPU), or are left out when it is
// empty; so is an unhealthy static MIG device.
func partitionDevices(d node.Device, common map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, opts SliceOptions) []resourceapi.Device {
	if !d.Health.Healthy && opts.TaintKey == "" {
		return nil
	}
	taints := opts.taints(d.Health)
	static := opts.staticMIG(d)
	var out []resourceapi.Device
	for _, m := range static {
		if m.UUID == "" || !m.Health.Healthy && opts.TaintKey == "" {
			continue
		}
		dev := migDevice(d, m, common)
		dev.Taints = append(opts.taints(m.Health, d.Health), opts.heldTaints(m.UUID)...)
		out = append(out, dev)
	}
	have := counters(d, static)
	set := CounterSetName(d)
	for _, pl := range placements(d) {
		use := consumption(d, pl.profile, pl.at)
		if !fits(use, have) {
			continue
		}
		attrs := copyAttrs(common)
		attrs[AttrType] = str("mig")
		attrs[AttrMIGProfile] = str(pl.profile.Name)
		attrs[AttrParentUUID] = str(d.UUID)
		attrs[AttrPlacementStart] = integer(int64(pl.at.Start))
		attrs[AttrPlacementSize] = integer(int64(pl.at.Size))
		capacity := map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{}
		if pl.profile.MemoryBytes > 0 {
			capacity[CapMemory] = resourceapi.DeviceCapacity{Value: *resource.NewQuantity(int64(pl.profile.MemoryBytes), resource.BinarySI)}
		}
		if pl.profile.SMs > 0 {
			capacity[CapMultiprocessors] = resourceapi.DeviceCapacity{Value: *resource.NewQuantity(int64(pl.profile.SMs), resource.DecimalSI)}
		}
		out = append(out, resourceapi.Device{
			Name: PlacementDeviceName(d, pl.profile.Name, pl.at.Start), Attributes: attrs, Capacity: capacity, Taints: taints,
			ConsumesCounters: []resourceapi.DeviceCounterConsumption{{CounterSet: set, Counters: use}},
		})
	}
	if len(static) == 0 {
		attrs := copyAttrs(common)
		attrs[AttrType] = str("gpu")
		attrs[AttrUUID] = str(d.UUID)
		attrs[AttrMIGCapable] = resourceapi.DeviceAttribute{BoolValue: ptr.To(true)}
		dev := resourceapi.Device{Name: DeviceName(d), Attributes: attrs, Taints: taints,
			ConsumesCounters: []resourceapi.DeviceCounterConsumption{{CounterSet: set, Counters: counters(d, nil)}}}
		if d.MemoryBytes > 0 {
			dev.Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
				CapMemory: {Value: *resource.NewQuantity(int64(d.MemoryBytes), resource.BinarySI)},
			}
		}
		out = append(out, dev)
	}
	return out
}

// fits tells whether every counter of use is in have with as much.
func fits(use, have map[string]resourceapi.Counter) bool {
	for k, u := range use {
		h, ok := have[k]
		if !ok || h.Value.Cmp(u.Value) < 0 {
			return false
		}
	}
	return true
}

// migDevice is MIG device m of d as the slice publishes it.
func migDevice(d node.Device, m node.MIGDevice, common map[resourceapi.QualifiedName]resourceapi.DeviceAttribute) resourceapi.Device {
	attrs := copyAttrs(common)
	attrs[AttrType] = str("mig")
	attrs[AttrUUID] = str(m.UUID)
	attrs[AttrMIGProfile] = str(m.Profile)
	attrs[AttrParentUUID] = str(d.UUID)
	attrs[AttrGI] = integer(int64(m.GI))
	attrs[AttrCI] = integer(int64(m.CI))
	capacity := map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{}
	if m.MemoryBytes > 0 {
		capacity[CapMemory] = resourceapi.DeviceCapacity{Value: *resource.NewQuantity(int64(m.MemoryBytes), resource.BinarySI)}
	}
	if m.SMs > 0 {
		capacity[CapMultiprocessors] = resourceapi.DeviceCapacity{Value: *resource.NewQuantity(int64(m.SMs), resource.DecimalSI)}
	}
	return resourceapi.Device{Name: MIGDeviceName(m), Attributes: attrs, Capacity: capacity}
}

// CounterSets are the counter sets of the GPUs of devs partitioned by
// dynamic MIG (opts.DynamicMIG), one per GPU, less what their static MIG
// devices take; devs are the allocator's view.
func CounterSets(devs []node.Device, opts SliceOptions) []resourceapi.CounterSet {
	var out []resourceapi.CounterSet
	for _, d := range devs {
		if opts.partitioned(d) {
			out = append(out, resourceapi.CounterSet{Name: CounterSetName(d), Counters: counters(d, opts.staticMIG(d))})
		}
	}
	return out
}

// PoolSlices splits a pool's devices and counter sets into slices that
// the API server takes: the devices in slices of at most 128, or 64 where
// one of them consumes counters or has taints, and the counter sets in
// slices of their own, at most 8 each. Devices keep their order. No
// devices and no counter sets give one empty slice (the pool stays).
func PoolSlices(devs []resourceapi.Device, sets []resourceapi.CounterSet) []resourceslice.Slice {
	limit := maxDevices
	if slices.ContainsFunc(devs, func(d resourceapi.Device) bool { return len(d.ConsumesCounters) > 0 || len(d.Taints) > 0 }) {
		limit = maxDevicesWithCounters
	}
	var out []resourceslice.Slice
	for len(devs) > 0 {
		n := min(limit, len(devs))
		out = append(out, resourceslice.Slice{Devices: devs[:n:n]})
		devs = devs[n:]
	}
	for len(sets) > 0 {
		n := min(maxCounterSets, len(sets))
		out = append(out, resourceslice.Slice{SharedCounters: sets[:n:n]})
		sets = sets[n:]
	}
	if len(out) == 0 {
		out = append(out, resourceslice.Slice{})
	}
	return out
}

// poolSlices are the slices of the driver's pool now: Devices and
// CounterSets of the allocator's view, split by PoolSlices.
func (d *Driver) poolSlices() []resourceslice.Slice {
	opts := d.cfg.Slice
	opts.held = d.heldElsewhere()
	var all []node.Device
	if len(opts.DynamicMIG) > 0 {
		// The MIG devices made for claims stand for their placements.
		all, opts.made = d.mig.view(d.alloc.Devices)
	} else {
		all = d.alloc.Devices()
	}
	return PoolSlices(Devices(d.inv, all, opts), CounterSets(all, opts))
}
