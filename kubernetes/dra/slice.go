package dra

import (
	"fmt"
	"slices"
	"strconv"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/utils/ptr"

	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/attributes"
)

// The attributes of a published device, in the driver's domain (a CEL
// selector reads device.attributes["gpu.gpuiso.io"].uuid), beside the
// standard resource.kubernetes.io/pciBusID, pcieRoot and numaNode.
const (
	AttrType              = "type"              // "gpu" or "mig"
	AttrUUID              = "uuid"              // "GPU-..." or "MIG-..."
	AttrIndex             = "index"             // NVML index (of the parent, for MIG)
	AttrMinor             = "minor"             // /dev/nvidia<minor>
	AttrModel             = "model"             // product name as a label value: "Tesla-V100-SXM2-16GB"
	AttrProductName       = "productName"       // product name as NVML gives it
	AttrBrand             = "brand"             // "Tesla", "NVIDIA", ...
	AttrArchitecture      = "architecture"      // "volta", "hopper", ...
	AttrComputeCapability = "computeCapability" // version: 7.0.0
	AttrDriverVersion     = "driverVersion"     // version: 550.127.5
	AttrCUDADriverVersion = "cudaDriverVersion" // version: 12.4.0
	AttrNUMANode          = "numaNode"          // int, -1 when unknown
	AttrMIGCapable        = "migCapable"        // bool, whole GPUs
	AttrNVLinkClique      = "nvlinkClique"      // GPUs with the same value are all NVLinked pairwise
	AttrMIGProfile        = "profile"           // MIG: "1g.10gb"
	AttrParentUUID        = "parentUUID"        // MIG: the parent's "GPU-" UUID
	AttrGI                = "gpuInstance"       // MIG: GPU-instance id
	AttrCI                = "computeInstance"   // MIG: compute-instance id

	CapMemory          = "memory"          // bytes
	CapMultiprocessors = "multiprocessors" // MIG: SMs
)

// The request policy of a share's memory, unless SliceOptions say
// otherwise: a claim gets at least DefaultShareMin, in steps of
// DefaultShareStep above it (a request between steps is rounded up by the
// scheduler), and DefaultShareMin when it asks for no memory. An MPS
// server's own context takes some hundreds of MiB of each client's limit,
// so a smaller share runs nothing.
const (
	DefaultShareMin  = 1 << 30
	DefaultShareStep = 256 << 20
)

// SliceOptions tune Devices.
type SliceOptions struct {
	// PCIeRoot, when set, gives a GPU's PCIe root complex ("pci0000:00")
	// from its bus id, for the standard pcieRoot attribute; ok false leaves
	// the attribute out. (The main program reads it from sysfs.)
	PCIeRoot func(busID string) (root string, ok bool)
	// Shared are the UUIDs of the GPUs published as memory shares
	// instead of whole: each as one device "share-<index>" of type
	// "share" that many claims may be allocated at once
	// (allowMultipleAllocations), each consuming part of its memory
	// capacity. A GPU split by MIG is never shared.
	Shared []string
	// ShareMin and ShareStep are the request policy of a share's memory
	// in bytes (default DefaultShareMin and DefaultShareStep): the least
	// a claim gets (and what it gets when it asks for no memory), and the
	// steps above it.
	ShareMin, ShareStep uint64
	// DynamicMIG are the UUIDs of the GPUs with MIG enabled that are
	// partitioned on demand (KEP-4815): each is published as a counter
	// set of its memory and compute slices and every placement of every
	// MIG profile, with the GPU whole, as devices that consume them; the
	// MIG device of a placement is made when a claim allocated it is
	// prepared (see partitionDevices, CounterSets).
	DynamicMIG []string
	// made are the MIG devices the driver made for claims (by UUID): a
	// partitioned GPU's others are a user's, published as they are.
	made map[string]bool
	// held are the devices (by UUID) that the allocator holds for an
	// owner that is no claim of the driver's (a pod of the device plugin
	// on the same allocator, another program of the node's): with
	// TaintKey set, each carries the taint HeldTaint, so that no claim the
	// driver could not prepare is allocated it.
	held map[string]bool
	// TaintKey, when set, is the key of the taint an unhealthy device is
	// published with (HealthTaint gives its value and effect): it stays in
	// the slice, and only a claim that tolerates the taint is allocated
	// it. Empty leaves unhealthy devices out of the slice, as a cluster
	// without device taints needs.
	TaintKey string
	// EvictForReset tells that the node resets a GPU whose health action
	// is a reset once nothing holds it (nvmlnode.WithReset): its taint,
	// and that of a GPU whose reset failed (action reboot), is NoExecute,
	// so that the cluster evicts the claims holding it (HealthTaintOf).
	EvictForReset bool
}

func (o SliceOptions) sharePolicy() (lo, step uint64) {
	lo, step = o.ShareMin, o.ShareStep
	if lo == 0 {
		lo = DefaultShareMin
	}
	if step == 0 {
		step = DefaultShareStep
	}
	return lo, step
}

// DeviceName is a GPU's name in the slice: "gpu-<index>".
func DeviceName(d node.Device) string { return "gpu-" + strconv.Itoa(d.Index) }

// ShareDeviceName is the name of a shared GPU's device in the slice:
// "share-<index>".
func ShareDeviceName(d node.Device) string { return "share-" + strconv.Itoa(d.Index) }

// MIGDeviceName is a MIG device's name in the slice:
// "mig-<index>-<gi>-<ci>".
func MIGDeviceName(m node.MIGDevice) string {
	return fmt.Sprintf("mig-%d-%d-%d", m.Parent, m.GI, m.CI)
}

// Devices are the devices of the node's ResourceSlice: every healthy whole
// GPU of devs and every healthy MIG device of a GPU split by MIG (whose
// parent is not published whole), with their attributes and capacity. devs
// are inv's devices with their current health (the allocator's view); inv
// gives the driver, CUDA version and topology. A GPU without a UUID is left
// out. An unhealthy GPU or MIG device (a MIG device of an unhealthy GPU
// too) carries the taints of opts.TaintKey, or is left out when it is
// empty: no claim that does not tolerate them can be allocated it. A GPU that
// opts.Shared names is published as shares only (shareDevice), never
// whole; one whose memory cannot hold the least share and one step is
// left out. A device the allocator holds for an owner that is no claim of
// the driver's carries HeldTaint (with TaintKey set).
func Devices(inv *node.Inventory, devs []node.Device, opts SliceOptions) []resourceapi.Device {
	cliques := NVLinkCliques(inv)
	var out []resourceapi.Device
	for p, d := range devs {
		if d.UUID == "" || !d.Health.Healthy && opts.TaintKey == "" {
			continue
		}
		common := commonAttributes(inv, d, opts)
		if opts.partitioned(d) {
			out = append(out, partitionDevices(d, common, opts)...)
			continue
		}
		if !d.MIGSplit() && slices.Contains(opts.Shared, d.UUID) {
			if dev, ok := shareDevice(d, common, opts); ok {
				dev.Taints = append(opts.taints(d.Health), opts.heldTaints(d.UUID)...)
				out = append(out, dev)
			}
			continue
		}
		if !d.MIGSplit() {
			attrs := copyAttrs(common)
			attrs[AttrType] = str("gpu")
			attrs[AttrUUID] = str(d.UUID)
			attrs[AttrMIGCapable] = resourceapi.DeviceAttribute{BoolValue: ptr.To(len(d.MIGProfiles) > 0)}
			if c, ok := cliques[p]; ok {
				attrs[AttrNVLinkClique] = str(c)
			}
			dev := resourceapi.Device{Name: DeviceName(d), Attributes: attrs, Taints: append(opts.taints(d.Health), opts.heldTaints(d.UUID)...)}
			if d.MemoryBytes > 0 {
				dev.Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
					CapMemory: {Value: *resource.NewQuantity(int64(d.MemoryBytes), resource.BinarySI)},
				}
			}
			out = append(out, dev)
			continue
		}
		for _, m := range d.MIGDevices {
			if m.UUID == "" || !(m.Health.Healthy && d.Health.Healthy) && opts.TaintKey == "" {
				continue
			}
			dev := migDevice(d, m, common)
			dev.Taints = append(opts.taints(m.Health, d.Health), opts.heldTaints(m.UUID)...)
			out = append(out, dev)
		}
	}
	return out
}

// shareDevice is GPU d published as memory shares: type "share", its
// uuid, and its memory as consumable capacity that several claims are
// allocated parts of (allowMultipleAllocations), each at least the
// policy's least share and a whole number of steps above it. Each
// allocation has its share id and the memory it consumed, which Prepare
// reads.
func shareDevice(d node.Device, common map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, opts SliceOptions) (resourceapi.Device, bool) {
	lo, step := opts.sharePolicy()
	if d.MemoryBytes < lo+step || lo > 1<<62 || step > 1<<62 {
		return resourceapi.Device{}, false
	}
	attrs := copyAttrs(common)
	attrs[AttrType] = str("share")
	attrs[AttrUUID] = str(d.UUID)
	least, stp := resource.NewQuantity(int64(lo), resource.BinarySI), resource.NewQuantity(int64(step), resource.BinarySI)
	return resourceapi.Device{
		Name: ShareDeviceName(d), Attributes: attrs, AllowMultipleAllocations: ptr.To(true),
		Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			CapMemory: {
				Value: *resource.NewQuantity(int64(d.MemoryBytes), resource.BinarySI),
				RequestPolicy: &resourceapi.CapacityRequestPolicy{
					Default:    least,
					ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: ptr.To(least.DeepCopy()), Step: stp},
				},
			},
		},
	}, true
}

func commonAttributes(inv *node.Inventory, d node.Device, opts SliceOptions) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	a := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		AttrIndex:    integer(int64(d.Index)),
		AttrNUMANode: integer(int64(d.NUMANode)),
	}
	if d.Minor != node.NoMinor {
		a[AttrMinor] = integer(int64(d.Minor))
	}
	setStr := func(k resourceapi.QualifiedName, v string) {
		if v != "" {
			a[k] = str(v)
		}
	}
	setStr(AttrProductName, d.Model)
	setStr(AttrModel, attributes.LabelValue(d.Model))
	setStr(AttrBrand, d.Brand)
	setStr(AttrArchitecture, d.Architecture)
	if v, ok := semver(d.ComputeCapability); ok {
		a[AttrComputeCapability] = version(v)
	}
	if v, ok := semver(inv.DriverVersion); ok {
		a[AttrDriverVersion] = version(v)
	}
	if c := inv.CUDAVersion; c > 0 {
		a[AttrCUDADriverVersion] = version(fmt.Sprintf("%d.%d.0", c.Major(), c.Minor()))
	}
	if d.BusID != "" {
		a[deviceattribute.StandardDeviceAttributePCIBusID] = str(d.BusID)
		if opts.PCIeRoot != nil {
			if root, ok := opts.PCIeRoot(d.BusID); ok {
				a[deviceattribute.StandardDeviceAttributePCIeRoot] = str(root)
			}
		}
	}
	if d.NUMANode >= 0 {
		a[deviceattribute.StandardDeviceAttributeNUMANode] = integer(int64(d.NUMANode))
	}
	return a
}

// NVLinkCliques partitions the node's whole GPUs into groups whose members
// are all NVLinked pairwise, for a matchAttribute constraint: a claim for
// several GPUs constrained to one AttrNVLinkClique gets GPUs that are
// directly connected. GPUs are taken in inventory order; each joins the
// first group all of whose members it links to, else starts one. A GPU
// with no NVLink to any other is in no group. The map is by position,
// the value "clique-<n>".
func NVLinkCliques(inv *node.Inventory) map[int]string {
	out := map[int]string{}
	if inv == nil || inv.Topology == nil {
		return out
	}
	t := inv.Topology
	var groups [][]int
	for i := range inv.Devices {
		if i >= t.Len() || inv.Devices[i].MIGSplit() {
			continue
		}
		linked := false
		for j := range inv.Devices {
			if j != i && j < t.Len() && t.Link(i, j).NVLinks > 0 && !inv.Devices[j].MIGSplit() {
				linked = true
				break
			}
		}
		if !linked {
			continue
		}
		placed := false
		for g, members := range groups {
			all := true
			for _, m := range members {
				if t.Link(i, m).NVLinks == 0 {
					all = false
					break
				}
			}
			if all {
				groups[g] = append(groups[g], i)
				placed = true
				break
			}
		}
		if !placed {
			groups = append(groups, []int{i})
		}
	}
	for g, members := range groups {
		if len(members) < 2 {
			continue
		}
		for _, m := range members {
			out[m] = "clique-" + strconv.Itoa(g)
		}
	}
	return out
}

// LabelValue makes s a valid label value: characters other than
// alphanumerics, '-', '_' and '.' become '-', at most 63, trimmed of
// non-alphanumeric ends.
//
// Deprecated: it is attributes.LabelValue (package node/attributes), the one cleaner of label values
// (the node labels and the device attributes share it); call that.
func LabelValue(s string) string { return attributes.LabelValue(s) }

// semver writes a dotted version as the semantic version a version
// attribute needs: "550.127.05" gives "550.127.5", "7.0" "7.0.0".
func semver(s string) (string, bool) {
	if s == "" {
		return "", false
	}
	v, err := node.ParseVersion(s)
	if err != nil || len(v) == 0 || len(v) > 3 {
		return "", false
	}
	for len(v) < 3 {
		v = append(v, 0)
	}
	return fmt.Sprintf("%d.%d.%d", v[0], v[1], v[2]), true
}

func str(s string) resourceapi.DeviceAttribute {
	return resourceapi.DeviceAttribute{StringValue: ptr.To(s)}
}
func integer(i int64) resourceapi.DeviceAttribute {
	return resourceapi.DeviceAttribute{IntValue: ptr.To(i)}
}
func version(s string) resourceapi.DeviceAttribute {
	return resourceapi.DeviceAttribute{VersionValue: ptr.To(s)}
}

func copyAttrs(m map[resourceapi.QualifiedName]resourceapi.DeviceAttribute) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	out := make(map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, len(m)+8)
	for k, v := range m {
		out[k] = v
	}
	return out
}
