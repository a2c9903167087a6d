package simnode

import (
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// ciProfileSlices are the compute slices of NVML's compute-instance
// profiles by index (nvml.COMPUTE_INSTANCE_PROFILE_*).
var ciProfileSlices = map[int]int{
	nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE: 1, nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE: 2,
	nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE: 3, nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE: 4,
	nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE: 7,
}

// addCreate gives GPU i's NVML device the calls that make a GPU instance
// at a placement (CreateGpuInstanceWithPlacement), as NVML's users make
// MIG devices: the GPU instance, then one compute instance spanning it
// (GetComputeInstanceProfileInfo, CreateComputeInstance). The simulated
// driver takes a GPU instance into the layout with its compute instance:
// until then it holds no place (two made at once may both be given the
// same placement; the second compute instance is then refused with
// ERROR_INSUFFICIENT_RESOURCES). Only compute instances spanning their
// GPU instance are supported.
func (n *Node) addCreate(i int, d *mock.Device, table []migProfile) {
	d.CreateGpuInstanceWithPlacementFunc = func(info *nvml.GpuInstanceProfileInfo, pl *nvml.GpuInstancePlacement) (nvml.GpuInstance, nvml.Return) {
		if info == nil || pl == nil {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		p, ok := profileByID(table, int(info.Id))
		if !ok || int(pl.Size) != p.size || !slices.Contains(p.starts, int(pl.Start)) {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		start := int(pl.Start)
		if ret := n.placeFree(i, p, start); ret != nvml.SUCCESS {
			return nil, ret
		}
		return n.pendingGI(i, p, start), nvml.SUCCESS
	}
}

// placeFree tells whether an instance of p fits at start on GPU i now.
func (n *Node) placeFree(i int, p migProfile, start int) nvml.Return {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.mig[i].enabled {
		return nvml.ERROR_NOT_SUPPORTED
	}
	var have []placed
	for _, in := range n.mig[i].instances {
		have = append(have, placed{in.profile, in.start})
	}
	if _, err := placeOne(p, have, &start); err != nil {
		return nvml.ERROR_INSUFFICIENT_RESOURCES
	}
	return nvml.SUCCESS
}

// pendingGI is a GPU instance of p at start on GPU i made by
// CreateGpuInstanceWithPlacement, before its compute instance.
func (n *Node) pendingGI(i int, p migProfile, start int) *mock.GpuInstance {
	var made *migInstance
	gi := &mock.GpuInstance{}
	gi.GetInfoFunc = func() (nvml.GpuInstanceInfo, nvml.Return) {
		return nvml.GpuInstanceInfo{Device: n.devices[i], Id: uint32(giID(start, p.size)), ProfileId: uint32(p.id),
			Placement: nvml.GpuInstancePlacement{Start: uint32(start), Size: uint32(p.size)}}, nvml.SUCCESS
	}
	gi.GetComputeInstanceProfileInfoFunc = func(profile, engine int) (nvml.ComputeInstanceProfileInfo, nvml.Return) {
		s, ok := ciProfileSlices[profile]
		if !ok || engine != nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED || s != p.slices {
			return nvml.ComputeInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
		}
		return nvml.ComputeInstanceProfileInfo{Id: uint32(profile), SliceCount: uint32(s), InstanceCount: 1, MultiprocessorCount: uint32(p.sms), SharedCopyEngineCount: uint32(p.slices)}, nvml.SUCCESS
	}
	gi.CreateComputeInstanceFunc = func(info *nvml.ComputeInstanceProfileInfo) (nvml.ComputeInstance, nvml.Return) {
		if info == nil || int(info.SliceCount) != p.slices {
			return nil, nvml.ERROR_NOT_SUPPORTED
		}
		if made != nil {
			return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
		}
		if ret := n.placeFree(i, p, start); ret != nvml.SUCCESS {
			return nil, ret
		}
		in := n.newInstance(i, p, start)
		n.mu.Lock()
		n.mig[i].instances = append(n.mig[i].instances, in)
		sortInstances(n.mig[i].instances)
		n.mu.Unlock()
		made = in
		return n.computeInstance(i, in), nvml.SUCCESS
	}
	gi.GetComputeInstanceByIdFunc = func(id int) (nvml.ComputeInstance, nvml.Return) {
		if made == nil || id != made.ci || !n.registered(i, made) {
			return nil, nvml.ERROR_NOT_FOUND
		}
		return n.computeInstance(i, made), nvml.SUCCESS
	}
	gi.DestroyFunc = func() nvml.Return {
		if made != nil && n.registered(i, made) {
			return nvml.ERROR_IN_USE
		}
		return nvml.SUCCESS
	}
	fillNotSupported(gi)
	return gi
}

// addInstanceCalls gives a MIG device's GPU instance the calls that reach
// its compute instance and destroy it: GetComputeInstanceById, and
// Destroy, refused (ERROR_IN_USE) while its compute instance stands.
func (n *Node) addInstanceCalls(i int, m *migInstance, gi *mock.GpuInstance) {
	gi.GetComputeInstanceByIdFunc = func(id int) (nvml.ComputeInstance, nvml.Return) {
		if id != m.ci || !n.registered(i, m) {
			return nil, nvml.ERROR_NOT_FOUND
		}
		return n.computeInstance(i, m), nvml.SUCCESS
	}
	gi.DestroyFunc = func() nvml.Return {
		if n.registered(i, m) {
			return nvml.ERROR_IN_USE
		}
		return nvml.SUCCESS
	}
}

// computeInstance is m's compute instance: its info, and Destroy, which
// takes the MIG device out of the layout.
func (n *Node) computeInstance(i int, m *migInstance) *mock.ComputeInstance {
	ci := &mock.ComputeInstance{}
	ci.GetInfoFunc = func() (nvml.ComputeInstanceInfo, nvml.Return) {
		return nvml.ComputeInstanceInfo{Device: m.handle, GpuInstance: m.gpuInst, Id: uint32(m.ci),
			Placement: nvml.ComputeInstancePlacement{Start: 0, Size: uint32(m.profile.slices)}}, nvml.SUCCESS
	}
	ci.DestroyFunc = func() nvml.Return {
		n.mu.Lock()
		defer n.mu.Unlock()
		st := &n.mig[i]
		k := slices.Index(st.instances, m)
		if k < 0 {
			return nvml.ERROR_NOT_FOUND
		}
		st.instances = slices.Delete(st.instances, k, k+1)
		return nvml.SUCCESS
	}
	fillNotSupported(ci)
	return ci
}

// registered tells whether m is in GPU i's layout.
func (n *Node) registered(i int, m *migInstance) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Contains(n.mig[i].instances, m)
}
