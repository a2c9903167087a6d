package node

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// NoNUMANode is the NUMA node of a device whose node NVML cannot tell.
const NoNUMANode = -1

// NoMinor is the minor number of a device NVML could not read (a lost GPU).
const NoMinor = -1

// Device is one GPU as discovered on the node. Its identity (UUID, bus id,
// minor number) is stable across restarts; its index is NVML's enumeration
// order and may change when the node's hardware does.
type Device struct {
	// Index is NVML's index of the device.
	Index int `json:"index"`
	// Minor is NVML's minor number of the GPU (the N of /dev/nvidia<N>), or
	// NoMinor.
	Minor int `json:"minor"`
	// Node is the GPU's device node as discovery found it: its path under
	// the dev root and its numbers. Its Path is empty when the minor is
	// unknown.
	Node DeviceNode `json:"node"`
	// UUID is NVML's "GPU-..." identifier.
	UUID string `json:"uuid,omitempty"`
	// BusID is the PCI address, normalised to lower case "0000:xx:yy.z".
	BusID string `json:"busId,omitempty"`
	// Model is the product name, e.g. "Tesla V100-SXM2-16GB".
	Model string `json:"model,omitempty"`
	// Brand is the product brand, e.g. "Tesla", "Quadro", "GeForce".
	Brand string `json:"brand,omitempty"`
	// Architecture is the chip generation in lower case, e.g. "volta", "hopper".
	Architecture string `json:"architecture,omitempty"`
	// ComputeCapability is CUDA's "<major>.<minor>", e.g. "7.0".
	ComputeCapability string `json:"computeCapability,omitempty"`
	// MemoryBytes is the total frame-buffer memory; 0 when unknown.
	MemoryBytes uint64 `json:"memoryBytes,omitempty"`
	// NUMANode is the host NUMA node the device is attached to, or NoNUMANode.
	NUMANode int `json:"numaNode"`
	// MIG is the device's current multi-instance GPU mode.
	MIG MIGMode `json:"mig,omitempty"`
	// MIGProfiles are the GPU-instance profiles of a MIG-capable GPU, read
	// whether or not MIG is enabled.
	MIGProfiles []MIGProfile `json:"migProfiles,omitempty"`
	// MIGDevices are the MIG devices of a GPU with MIG enabled, in GPU- then
	// compute-instance id order. Such a GPU is handed out only by its MIG
	// devices, never whole.
	MIGDevices []MIGDevice `json:"migDevices,omitempty"`
	// Health tells whether the device may be handed out.
	Health Health `json:"health"`
	// Attributes are Nomad-style fingerprint attributes (see the Attr
	// constants). An attribute NVML cannot read is absent from the map.
	Attributes Attributes `json:"attributes,omitempty"`
}

// DeviceNode is a character device node of the host: its path (under the
// dev root discovery read) and its numbers, as the kernel has them.
type DeviceNode struct {
	Path  string `json:"path"`
	Major uint32 `json:"major"`
	Minor uint32 `json:"minor"`
}

// String is "<path> (<major>:<minor>)".
func (n DeviceNode) String() string {
	return fmt.Sprintf("%s (%d:%d)", n.Path, n.Major, n.Minor)
}

// Clone returns a deep copy of d: Attributes are values, so the copy shares
// nothing with d.
func (d Device) Clone() Device {
	d.Attributes = maps.Clone(d.Attributes)
	d.MIGProfiles = slices.Clone(d.MIGProfiles)
	for i := range d.MIGProfiles {
		d.MIGProfiles[i].Placements = slices.Clone(d.MIGProfiles[i].Placements)
	}
	d.MIGDevices = slices.Clone(d.MIGDevices)
	return d
}

// MIGSplit tells whether the GPU is split into MIG devices: MIG is enabled,
// so it is handed out by instance and never whole.
func (d Device) MIGSplit() bool { return d.MIG == MIGEnabled }

// NodeName is the device node's name under the dev root, "nvidia<minor>",
// or "" when the minor number is unknown.
func (d Device) NodeName() string {
	if d.Minor < 0 {
		return ""
	}
	return "nvidia" + strconv.Itoa(d.Minor)
}

// MIGMode is the multi-instance GPU mode of a device.
type MIGMode string

// MIG modes. The zero value means NVML did not say.
const (
	MIGDisabled    MIGMode = "disabled"
	MIGEnabled     MIGMode = "enabled"
	MIGUnsupported MIGMode = "unsupported"
)

// Health is whether a device may be handed out, and why not.
type Health struct {
	Healthy bool   `json:"healthy"`
	Reason  string `json:"reason,omitempty"`
}

// Healthy returns the health of a device that works.
func Healthy() Health { return Health{Healthy: true} }

// Unhealthy returns the health of a device that must not be handed out.
func Unhealthy(reason string) Health { return Health{Reason: reason} }

func (h Health) String() string {
	if h.Healthy {
		return "healthy"
	}
	if h.Reason == "" {
		return "unhealthy"
	}
	return "unhealthy: " + h.Reason
}

// Fingerprint attribute names, as Nomad's NVIDIA device plugin names them.
const (
	AttrMemory          = "memory"           // total memory, MiB
	AttrBAR1            = "bar1"             // BAR1 memory, MiB
	AttrPower           = "power"            // power management limit, W
	AttrCoresClock      = "cores_clock"      // maximum SM clock, MHz
	AttrMemoryClock     = "memory_clock"     // maximum memory clock, MHz
	AttrPCIBandwidth    = "pci_bandwidth"    // maximum PCIe bandwidth, MB/s
	AttrDriverVersion   = "driver_version"   // e.g. "535.104.05"
	AttrDisplayState    = "display_state"    // "Enabled" or "Disabled"
	AttrPersistenceMode = "persistence_mode" // "Enabled" or "Disabled"
)

// Units of the numeric attributes.
const (
	UnitMiB  = "MiB"
	UnitW    = "W"
	UnitMHz  = "MHz"
	UnitMBps = "MB/s"
)

// Attributes are a device's fingerprint attributes by name.
type Attributes map[string]Attribute

// AttributeKind is the type of an attribute's value.
type AttributeKind string

// Attribute kinds. The zero kind is an attribute with no value.
const (
	KindInt    AttributeKind = "int"
	KindString AttributeKind = "string"
	KindBool   AttributeKind = "bool"
)

// Attribute is one typed fingerprint value: Kind says which of Int, String
// and Bool holds it. Numeric values carry their unit. An Attribute is a
// plain value: copies never share anything.
type Attribute struct {
	Kind   AttributeKind `json:"kind"`
	Int    int64         `json:"int,omitempty"`
	String string        `json:"string,omitempty"`
	Bool   bool          `json:"bool,omitempty"`
	Unit   string        `json:"unit,omitempty"`
}

// IntAttribute returns a numeric attribute in unit.
func IntAttribute(v int64, unit string) Attribute {
	return Attribute{Kind: KindInt, Int: v, Unit: unit}
}

// StringAttribute returns a string attribute.
func StringAttribute(v string) Attribute { return Attribute{Kind: KindString, String: v} }

// BoolAttribute returns a boolean attribute.
func BoolAttribute(v bool) Attribute { return Attribute{Kind: KindBool, Bool: v} }

// Format renders the value as a person reads it: "16384 MiB", "Enabled", "true".
func (a Attribute) Format() string {
	switch a.Kind {
	case KindInt:
		return strings.TrimSpace(fmt.Sprintf("%d %s", a.Int, a.Unit))
	case KindString:
		return a.String
	case KindBool:
		return strconv.FormatBool(a.Bool)
	}
	return ""
}

// DeviceRef identifies an allocated GPU: what an isolator needs to expose
// it to a container. The full Device is in the inventory.
type DeviceRef struct {
	// Index is NVML's index of the GPU.
	Index int `json:"index"`
	// Minor is NVML's minor number of the GPU, or NoMinor.
	Minor int `json:"minor"`
	// UUID is NVML's "GPU-..." identifier.
	UUID string `json:"uuid,omitempty"`
	// BusID is the PCI address, "0000:xx:yy.z".
	BusID string `json:"busId,omitempty"`
	// Model is the product name.
	Model string `json:"model,omitempty"`
	// Node is the GPU's device node.
	Node DeviceNode `json:"node"`
	// MIG, when set, makes the reference a MIG device of the GPU: UUID is
	// then the device's "MIG-" UUID, and Index, Minor, BusID, Model and
	// Node are its parent's.
	MIG *MIGRef `json:"mig,omitempty"`
}

// Ref is the device's identity as allocations carry it.
func (d Device) Ref() DeviceRef {
	return DeviceRef{Index: d.Index, Minor: d.Minor, UUID: d.UUID, BusID: d.BusID, Model: d.Model, Node: d.Node}
}
