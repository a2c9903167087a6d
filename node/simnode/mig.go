package simnode

import (
	"crypto/sha256"
	"fmt"
	"os"
	"path"
	"slices"
	"sort"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/node"
)

// MIGLayout is how a GPU of a topology is split: its presence enables MIG on
// the GPU, and Instances are its GPU instances, each holding one compute
// instance that spans it (a MIG device).
type MIGLayout struct {
	Instances []MIGInstance `json:"instances"`
}

// MIGInstance is one GPU instance of a layout: a profile name of the GPU's
// profile table ("1g.10gb") and, optionally, its placement's start in memory
// slices (by default the first free placement the profile allows).
type MIGInstance struct {
	Profile string `json:"profile"`
	Start   *int   `json:"start,omitempty"`
}

// migProfile is one GPU-instance profile of a simulated GPU model: the
// index NVML's GetGpuInstanceProfileInfo takes, and what it answers.
type migProfile struct {
	index  int    // NVML profile index (nvml.GPU_INSTANCE_PROFILE_*)
	id     int    // NVML profile id
	name   string // "1g.10gb"
	slices int    // compute slices
	count  int    // instances per GPU
	sms    int
	memMiB int
	size   int   // placement size in memory slices
	starts []int // placement starts
}

func (p migProfile) placements() []nvml.GpuInstancePlacement {
	out := make([]nvml.GpuInstancePlacement, len(p.starts))
	for k, s := range p.starts {
		out[k] = nvml.GpuInstancePlacement{Start: uint32(s), Size: uint32(p.size)}
	}
	return out
}

func (p migProfile) info() nvml.GpuInstanceProfileInfo {
	return nvml.GpuInstanceProfileInfo{
		Id: uint32(p.id), SliceCount: uint32(p.slices), InstanceCount: uint32(p.count),
		MultiprocessorCount: uint32(p.sms), CopyEngineCount: uint32(p.slices), MemorySizeMB: uint64(p.memMiB),
	}
}

// MIG profile tables of the GPU models the topologies use, as their drivers
// report them (profile ids and placements are the same on A100 and H100).
var migProfileTables = map[string][]migProfile{
	"a100-40gb": {
		{nvml.GPU_INSTANCE_PROFILE_1_SLICE, 19, "1g.5gb", 1, 7, 14, 4864, 1, []int{0, 1, 2, 3, 4, 5, 6}},
		{nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, 20, "1g.5gb+me", 1, 1, 14, 4864, 1, []int{0, 1, 2, 3, 4, 5, 6}},
		{nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2, 15, "1g.10gb", 1, 4, 14, 9856, 2, []int{0, 2, 4, 6}},
		{nvml.GPU_INSTANCE_PROFILE_2_SLICE, 14, "2g.10gb", 2, 3, 28, 9856, 2, []int{0, 2, 4}},
		{nvml.GPU_INSTANCE_PROFILE_3_SLICE, 9, "3g.20gb", 3, 2, 42, 19968, 4, []int{0, 4}},
		{nvml.GPU_INSTANCE_PROFILE_4_SLICE, 5, "4g.20gb", 4, 1, 56, 19968, 4, []int{0}},
		{nvml.GPU_INSTANCE_PROFILE_7_SLICE, 0, "7g.40gb", 7, 1, 98, 40192, 8, []int{0}},
	},
	"h100-80gb": {
		{nvml.GPU_INSTANCE_PROFILE_1_SLICE, 19, "1g.10gb", 1, 7, 16, 9984, 1, []int{0, 1, 2, 3, 4, 5, 6}},
		{nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, 20, "1g.10gb+me", 1, 1, 16, 9984, 1, []int{0, 1, 2, 3, 4, 5, 6}},
		{nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2, 15, "1g.20gb", 1, 4, 26, 20096, 2, []int{0, 2, 4, 6}},
		{nvml.GPU_INSTANCE_PROFILE_2_SLICE, 14, "2g.20gb", 2, 3, 32, 20096, 2, []int{0, 2, 4}},
		{nvml.GPU_INSTANCE_PROFILE_3_SLICE, 9, "3g.40gb", 3, 2, 60, 40448, 4, []int{0, 4}},
		{nvml.GPU_INSTANCE_PROFILE_4_SLICE, 5, "4g.40gb", 4, 1, 64, 40448, 4, []int{0}},
		{nvml.GPU_INSTANCE_PROFILE_7_SLICE, 0, "7g.80gb", 7, 1, 132, 81152, 8, []int{0}},
	},
}

// MIGProfileTables lists the names of the MIG profile tables a topology's
// GPU model may name ("migProfiles").
func MIGProfileTables() []string {
	var out []string
	for k := range migProfileTables {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// maxMIGDevices is the most MIG devices a GPU holds (seven compute slices).
const maxMIGDevices = 7

// invalidInstance is the GPU- or compute-instance id of an event that is
// about the whole GPU.
const invalidInstance = 0xFFFFFFFF

// giID is the GPU-instance id the driver gives an instance at placement
// start of size memory slices: 0 for the whole GPU, 1-2 for halves, 3-6 for
// quarters, 7-13 for single slices, so ids never collide on one GPU.
func giID(start, size int) int {
	switch size {
	case 8:
		return 0
	case 4:
		return 1 + start/4
	case 2:
		return 3 + start/2
	}
	return 7 + start
}

// migInstance is a GPU instance of a simulated GPU with its one compute
// instance, the MIG device.
type migInstance struct {
	profile migProfile
	start   int
	gi, ci  int
	uuid    string
	handle  *mock.Device
	gpuInst *mock.GpuInstance
}

func (m *migInstance) placement() nvml.GpuInstancePlacement {
	return nvml.GpuInstancePlacement{Start: uint32(m.start), Size: uint32(m.profile.size)}
}

// migState is one GPU's MIG side.
type migState struct {
	enabled   bool
	instances []*migInstance // by GPU-instance id
}

// profiles is the MIG profile table of the node's GPU model (nil when the
// model has none).
func (s *Spec) profiles() []migProfile {
	if !s.GPU.MIGCapable {
		return nil
	}
	return migProfileTables[s.GPU.MIGProfiles]
}

func profileByName(table []migProfile, name string) (migProfile, bool) {
	i := slices.IndexFunc(table, func(p migProfile) bool { return p.name == name })
	if i < 0 {
		return migProfile{}, false
	}
	return table[i], true
}

func profileByID(table []migProfile, id int) (migProfile, bool) {
	i := slices.IndexFunc(table, func(p migProfile) bool { return p.id == id })
	if i < 0 {
		return migProfile{}, false
	}
	return table[i], true
}

// ErrMIGLayout: a MIG layout breaks the GPU's slice rules (an unknown
// profile, a placement the profile does not allow, overlapping instances,
// more instances of a profile than the GPU holds), or MIG is asked of a GPU
// that has none.
var ErrMIGLayout = node.Sentinel(node.ErrInvalid, "invalid MIG layout")

// placeAll checks a layout against the profile table and places its
// instances, in order, each at its start or the first free placement.
func placeAll(table []migProfile, layout []MIGInstance) ([]placed, error) {
	var out []placed
	for k, in := range layout {
		p, ok := profileByName(table, in.Profile)
		if !ok {
			return nil, fmt.Errorf("instance %d: profile %q is not in the GPU's table: %w", k, in.Profile, ErrMIGLayout)
		}
		start, err := placeOne(p, out, in.Start)
		if err != nil {
			return nil, fmt.Errorf("instance %d (%s): %w", k, in.Profile, err)
		}
		out = append(out, placed{p, start})
	}
	return out, nil
}

type placed struct {
	profile migProfile
	start   int
}

// placeOne finds where an instance of p goes beside have: at start when
// given, else the first allowed placement that is free.
func placeOne(p migProfile, have []placed, start *int) (int, error) {
	n := 0
	for _, h := range have {
		if h.profile.id == p.id {
			n++
		}
	}
	if n >= p.count {
		return 0, fmt.Errorf("the GPU holds at most %d: %w", p.count, ErrMIGLayout)
	}
	free := func(s int) bool {
		for _, h := range have {
			if s < h.start+h.profile.size && h.start < s+p.size {
				return false
			}
		}
		return true
	}
	if start != nil {
		if !slices.Contains(p.starts, *start) {
			return 0, fmt.Errorf("start %d is not one of the profile's placements %v: %w", *start, p.starts, ErrMIGLayout)
		}
		if !free(*start) {
			return 0, fmt.Errorf("placement %d:%d overlaps another instance: %w", *start, p.size, ErrMIGLayout)
		}
		return *start, nil
	}
	for _, s := range p.starts {
		if free(s) {
			return s, nil
		}
	}
	return 0, fmt.Errorf("no free placement: %w", ErrMIGLayout)
}

// MIGUUID is the stable UUID of the MIG device at GPU instance gi, compute
// instance ci of GPU i: derived from the topology, the GPU and the
// instance's placement, so the same layout has the same UUIDs in every run.
func (n *Node) MIGUUID(i, gi, ci int) string {
	sum := sha256.Sum256([]byte(fmt.Sprintf("%s/%d/mig/%d/%d", n.spec.Name, i, gi, ci)))
	return fmt.Sprintf("MIG-%x-%x-%x-%x-%x", sum[0:4], sum[4:6], sum[6:8], sum[8:10], sum[10:16])
}

// initMIG sets up GPU i's MIG state from its layout in the spec.
func (n *Node) initMIG(i int) error {
	g := n.spec.GPUs[i]
	if g.MIG == nil {
		return nil
	}
	table := n.spec.profiles()
	if table == nil {
		return fmt.Errorf("GPU %d: model %q has no MIG profile table: %w", i, n.spec.GPU.Model, ErrMIGLayout)
	}
	ps, err := placeAll(table, g.MIG.Instances)
	if err != nil {
		return fmt.Errorf("GPU %d: %w", i, err)
	}
	n.mig[i].enabled = true
	for _, p := range ps {
		n.mig[i].instances = append(n.mig[i].instances, n.newInstance(i, p.profile, p.start))
	}
	sortInstances(n.mig[i].instances)
	return nil
}

func sortInstances(ins []*migInstance) {
	sort.Slice(ins, func(a, b int) bool { return ins[a].gi < ins[b].gi })
}

// newInstance builds the NVML side of a MIG device of GPU i.
func (n *Node) newInstance(i int, p migProfile, start int) *migInstance {
	m := &migInstance{profile: p, start: start, gi: giID(start, p.size), ci: 0}
	m.uuid = n.MIGUUID(i, m.gi, m.ci)
	parent := n.devices[i]
	d := &mock.Device{}
	d.GetUUIDFunc = func() (string, nvml.Return) { return m.uuid, nvml.SUCCESS }
	d.GetGpuInstanceIdFunc = func() (int, nvml.Return) { return m.gi, nvml.SUCCESS }
	d.GetComputeInstanceIdFunc = func() (int, nvml.Return) { return m.ci, nvml.SUCCESS }
	d.IsMigDeviceHandleFunc = func() (bool, nvml.Return) { return true, nvml.SUCCESS }
	d.GetDeviceHandleFromMigDeviceHandleFunc = func() (nvml.Device, nvml.Return) { return parent, nvml.SUCCESS }
	d.GetNameFunc = func() (string, nvml.Return) { return n.spec.GPU.Model + " MIG " + p.name, nvml.SUCCESS }
	d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
		total := uint64(p.memMiB) * mib
		return nvml.Memory{Total: total, Free: total}, nvml.SUCCESS
	}
	d.GetAttributesFunc = func() (nvml.DeviceAttributes, nvml.Return) {
		return nvml.DeviceAttributes{
			MultiprocessorCount: uint32(p.sms), SharedCopyEngineCount: uint32(p.slices),
			GpuInstanceSliceCount: uint32(p.slices), ComputeInstanceSliceCount: uint32(p.slices),
			MemorySizeMB: uint64(p.memMiB),
		}, nvml.SUCCESS
	}
	fillNotSupported(d)
	guardLost(d, func() bool { return n.isLost(i) })
	m.handle = d

	gi := &mock.GpuInstance{}
	gi.GetInfoFunc = func() (nvml.GpuInstanceInfo, nvml.Return) {
		return nvml.GpuInstanceInfo{Device: parent, Id: uint32(m.gi), ProfileId: uint32(p.id), Placement: m.placement()}, nvml.SUCCESS
	}
	n.addInstanceCalls(i, m, gi)
	fillNotSupported(gi)
	m.gpuInst = gi
	return m
}

// addMIG gives GPU i's NVML device its MIG calls. It runs before the
// device's remaining calls are filled in.
func (n *Node) addMIG(i int, d *mock.Device) {
	table := n.spec.profiles()
	d.IsMigDeviceHandleFunc = func() (bool, nvml.Return) { return false, nvml.SUCCESS }
	if !n.spec.GPU.MIGCapable {
		return
	}
	d.GetMigModeFunc = func() (int, int, nvml.Return) {
		n.mu.Lock()
		defer n.mu.Unlock()
		if n.mig[i].enabled {
			return nvml.DEVICE_MIG_ENABLE, nvml.DEVICE_MIG_ENABLE, nvml.SUCCESS
		}
		return nvml.DEVICE_MIG_DISABLE, nvml.DEVICE_MIG_DISABLE, nvml.SUCCESS
	}
	d.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return maxMIGDevices, nvml.SUCCESS }
	d.GetMigDeviceHandleByIndexFunc = func(k int) (nvml.Device, nvml.Return) {
		if k < 0 || k >= maxMIGDevices {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		n.mu.Lock()
		defer n.mu.Unlock()
		if !n.mig[i].enabled || k >= len(n.mig[i].instances) {
			return nil, nvml.ERROR_NOT_FOUND
		}
		return n.mig[i].instances[k].handle, nvml.SUCCESS
	}
	if table == nil {
		return
	}
	d.GetGpuInstanceProfileInfoFunc = func(index int) (nvml.GpuInstanceProfileInfo, nvml.Return) {
		if index < 0 || index >= nvml.GPU_INSTANCE_PROFILE_COUNT {
			return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_INVALID_ARGUMENT
		}
		k := slices.IndexFunc(table, func(p migProfile) bool { return p.index == index })
		if k < 0 {
			return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
		}
		return table[k].info(), nvml.SUCCESS
	}
	d.GetGpuInstancePossiblePlacementsFunc = func(info *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstancePlacement, nvml.Return) {
		if info == nil {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		p, ok := profileByID(table, int(info.Id))
		if !ok {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		return p.placements(), nvml.SUCCESS
	}
	d.GetGpuInstanceByIdFunc = func(id int) (nvml.GpuInstance, nvml.Return) {
		n.mu.Lock()
		defer n.mu.Unlock()
		if !n.mig[i].enabled {
			return nil, nvml.ERROR_NOT_SUPPORTED
		}
		for _, m := range n.mig[i].instances {
			if m.gi == id {
				return m.gpuInst, nvml.SUCCESS
			}
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
	d.GetGpuInstancesFunc = func(info *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstance, nvml.Return) {
		if info == nil {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		n.mu.Lock()
		defer n.mu.Unlock()
		var out []nvml.GpuInstance
		for _, m := range n.mig[i].instances {
			if m.profile.id == int(info.Id) {
				out = append(out, m.gpuInst)
			}
		}
		return out, nvml.SUCCESS
	}
	n.addCreate(i, d, table)
}

// migHandle finds a MIG device's NVML handle by UUID.
func (n *Node) migHandle(uuid string) (nvml.Device, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, st := range n.mig {
		for _, m := range st.instances {
			if m.uuid == uuid {
				return m.handle, true
			}
		}
	}
	return nil, false
}

// MIGDevice is a simulated MIG device as a test sees it.
type MIGDevice struct {
	GPU       int // the parent's index
	GI, CI    int
	Profile   string
	ProfileID int
	Start     int // placement start, in memory slices
	Size      int // placement size
	UUID      string
}

// MIGEnabled tells whether GPU i has MIG enabled.
func (n *Node) MIGEnabled(i int) bool {
	if i < 0 || i >= n.Len() {
		return false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.mig[i].enabled
}

// MIGDevices lists GPU i's MIG devices in GPU-instance id order.
func (n *Node) MIGDevices(i int) []MIGDevice {
	if i < 0 || i >= n.Len() {
		return nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []MIGDevice
	for _, m := range n.mig[i].instances {
		out = append(out, MIGDevice{GPU: i, GI: m.gi, CI: m.ci, Profile: m.profile.name, ProfileID: m.profile.id, Start: m.start, Size: m.profile.size, UUID: m.uuid})
	}
	return out
}

// InjectMIGXID delivers an XID critical-error event of the MIG device at GPU
// instance gi, compute instance ci of GPU i, as the driver attributes it.
func (n *Node) InjectMIGXID(i, gi, ci int, xid uint64) error {
	if i < 0 || i >= n.Len() {
		return fmt.Errorf("inject XID %d into GPU %d of %d: %w", xid, i, n.Len(), ErrNoSuchGPU)
	}
	found := slices.ContainsFunc(n.MIGDevices(i), func(m MIGDevice) bool { return m.GI == gi && m.CI == ci })
	if !found {
		return fmt.Errorf("inject XID %d into GPU %d instance %d/%d: %w", xid, i, gi, ci, ErrNoSuchMIGDevice)
	}
	if err := n.changeFaults(i, func(*gpuFaults) {}, faultEvent{GI: uint32(gi), CI: uint32(ci), Type: nvml.EventTypeXidCriticalError, Data: xid}); err != nil {
		return fmt.Errorf("inject XID %d into GPU %d instance %d/%d: %w", xid, i, gi, ci, err)
	}
	return nil
}

// MIG minor numbers of the nvidia-caps driver: config and monitor, then for
// each GPU minor g, GPU instance i (of 15) and compute instance c (of 8)
// consecutive minors, the GPU instance's access first.
const (
	capsConfigMinor  = 1
	capsMonitorMinor = 2
	capsGIs          = 15
	capsCIs          = 8
)

func giAccessMinor(gpuMinor, gi int) int {
	return 3 + (gpuMinor*capsGIs+gi)*(capsCIs+1)
}

func ciAccessMinor(gpuMinor, gi, ci int) int { return giAccessMinor(gpuMinor, gi) + 1 + ci }

// populateCaps writes the MIG side of the host tree: the nvidia-caps
// driver's mig-minors table (every GPU instance and compute instance a GPU
// of the node could have), the capability files of config, monitor and
// every existing instance, and their nodes under <dev>/nvidia-caps, in r.
func (n *Node) populateCaps(r *os.Root, h *Host) error {
	if !n.spec.GPU.MIGCapable {
		return nil
	}
	var minors strings.Builder
	fmt.Fprintf(&minors, "config %d\nmonitor %d\n", capsConfigMinor, capsMonitorMinor)
	for i := range n.spec.GPUs {
		g := n.spec.minor(i)
		for gi := range capsGIs {
			fmt.Fprintf(&minors, "%s %d\n", node.MIGGIAccessName(g, gi), giAccessMinor(g, gi))
			for ci := range capsCIs {
				fmt.Fprintf(&minors, "%s %d\n", node.MIGCIAccessName(g, gi, ci), ciAccessMinor(g, gi, ci))
			}
		}
	}
	caps := "proc/driver/nvidia/capabilities"
	capFile := func(minor, mode int) string {
		return fmt.Sprintf("DeviceFileMinor: %d\nDeviceFileMode: %d\nDeviceFileModify: 1\n", minor, mode)
	}
	files := map[string]string{
		"proc/driver/nvidia-caps/mig-minors": minors.String(),
		path.Join(caps, "mig", "config"):     capFile(capsConfigMinor, 0o400),
		path.Join(caps, "mig", "monitor"):    capFile(capsMonitorMinor, 0o444),
	}
	nodes := map[string]linux.DeviceNumber{}
	modes := map[string]os.FileMode{}
	capNode := func(minor int, mode os.FileMode) {
		name := fmt.Sprintf("nvidia-cap%d", minor)
		nodes[name] = linux.DeviceNumber{Char: true, Major: h.CapsMajor, Minor: uint32(minor)}
		modes[name] = mode
	}
	capNode(capsConfigMinor, 0o400)
	capNode(capsMonitorMinor, 0o444)
	for i := range n.spec.GPUs {
		g := n.spec.minor(i)
		for _, m := range n.MIGDevices(i) {
			gm, cm := giAccessMinor(g, m.GI), ciAccessMinor(g, m.GI, m.CI)
			dir := path.Join(caps, fmt.Sprintf("gpu%d", g), "mig", fmt.Sprintf("gi%d", m.GI))
			files[path.Join(dir, "access")] = capFile(gm, 0o444)
			files[path.Join(dir, fmt.Sprintf("ci%d", m.CI), "access")] = capFile(cm, 0o444)
			capNode(gm, 0o444)
			capNode(cm, 0o444)
		}
	}
	if err := mknodIn(r, path.Join("dev", node.NVIDIACapsDir), nodes, modes); err != nil {
		return err
	}
	return writeIn(r, files)
}
