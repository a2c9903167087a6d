package dra

import (
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/utils/ptr"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/isolator"
)

// Attributes a prepared device's metadata file has beyond those of its
// device in the slice: what the claim was given, which the slice cannot
// say. The slice's attributes are there too (uuid, index, the PCI bus id
// and PCIe root, NUMA node, NVLink clique, MIG profile, ...), uuid being
// the device the claim holds (a dynamic MIG device's, where the slice
// names a placement).
const (
	AttrShareMemory         = "shareMemory"         // int: a share's memory, bytes
	AttrShareComputePercent = "shareComputePercent" // int: a share's compute percentage, 0 for no limit
	AttrShareID             = "shareID"             // the allocation's share id
	AttrMPSPipeDirectory    = "mpsPipeDirectory"    // a share's MPS pipe directory, as its containers see it
	AttrAdminAccess         = "adminAccess"         // bool: allocated with admin access, held by nobody
)

// withMetadata sets the metadata of devs, cp's devices as cp.result gives
// them, when the driver writes device metadata (Config.DeviceMetadata):
// the attributes of each device in the node's slice now, and what cp
// records of it. A device the slice no longer lists (one that became
// unhealthy, with unhealthy devices left out) has what cp records alone.
func (d *Driver) withMetadata(cp Checkpoint, devs []kubeletplugin.Device) []kubeletplugin.Device {
	if !d.cfg.DeviceMetadata || len(devs) == 0 {
		return devs
	}
	d.mu.Lock()
	pool := d.poolSlices()
	d.mu.Unlock()
	published := map[string]map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}
	for _, s := range pool {
		for _, dev := range s.Devices {
			published[dev.Name] = dev.Attributes
		}
	}
	for i := range devs {
		pd := cp.Devices[i]
		attrs := map[string]resourceapi.DeviceAttribute{}
		for k, v := range published[pd.Device] {
			attrs[string(k)] = v
		}
		if pd.UUID != "" {
			attrs[AttrUUID] = str(pd.UUID)
		}
		if m := pd.MIG; m != nil {
			attrs[AttrType] = str("mig")
			attrs[AttrMIGProfile] = str(m.Profile)
			attrs[AttrParentUUID] = str(m.Parent)
			attrs[AttrGI] = integer(int64(m.GI))
			attrs[AttrCI] = integer(int64(m.CI))
		}
		if pd.Admin {
			attrs[AttrAdminAccess] = resourceapi.DeviceAttribute{BoolValue: ptr.To(true)}
		}
		if pd.ShareID != "" {
			attrs[AttrShareID] = str(pd.ShareID)
		}
		if s := cp.Share; s != nil && !pd.Admin {
			// A memory share has its limits; a concurrent slice its GPU's
			// daemon (its limits are the daemon's defaults); a time slice
			// neither.
			if s.Mode == "" || s.Mode == allocator.ShareMemory {
				attrs[AttrShareMemory] = integer(int64(min(s.MemoryBytes, 1<<62)))
				attrs[AttrShareComputePercent] = integer(int64(s.ComputePercent))
			}
			if s.daemon() {
				attrs[AttrMPSPipeDirectory] = str(isolator.MPSPipeDir)
			}
		}
		devs[i].Metadata = &kubeletplugin.DeviceMetadata{Attributes: attrs}
	}
	return devs
}
