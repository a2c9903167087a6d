package nvmlnode

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/node"
)

// profileSuffix is what nvidia-smi appends to the name of the GPU-instance
// profiles that differ from the plain one of the same size only in their
// media engines or graphics.
func profileSuffix(index int) string {
	switch index {
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, nvml.GPU_INSTANCE_PROFILE_2_SLICE_REV1:
		return "+me"
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME, nvml.GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME:
		return "+me.all"
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_NO_ME, nvml.GPU_INSTANCE_PROFILE_2_SLICE_NO_ME:
		return "-me"
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_GFX, nvml.GPU_INSTANCE_PROFILE_2_SLICE_GFX,
		nvml.GPU_INSTANCE_PROFILE_3_SLICE_GFX, nvml.GPU_INSTANCE_PROFILE_4_SLICE_GFX:
		return "+gfx"
	}
	return ""
}

// mig reads a MIG-capable GPU's profile table (also with MIG disabled: it
// only reads) and, with MIG enabled, its MIG devices as they stand.
// Discovery never changes a GPU's MIG mode or layout.
func (d *discovery) mig(r *reader, h nvml.Device, dev *node.Device) {
	if dev.MIG != node.MIGEnabled && dev.MIG != node.MIGDisabled {
		return
	}
	for idx := range nvml.GPU_INSTANCE_PROFILE_COUNT {
		info, ret := h.GetGpuInstanceProfileInfo(idx)
		if !r.ok("get gpu instance profile info", ret) {
			continue
		}
		p := node.MIGProfile{
			Name: node.MIGProfileName(int(info.SliceCount), info.MemorySizeMB*mib, profileSuffix(idx)),
			ID:   int(info.Id), Count: int(info.InstanceCount), Slices: int(info.SliceCount),
			SMs: int(info.MultiprocessorCount), MemoryBytes: info.MemorySizeMB * mib,
		}
		if pl, ret := h.GetGpuInstancePossiblePlacements(&info); r.ok("get gpu instance possible placements", ret) {
			for _, x := range pl {
				p.Placements = append(p.Placements, node.MIGPlacement{Start: int(x.Start), Size: int(x.Size)})
			}
		}
		dev.MIGProfiles = append(dev.MIGProfiles, p)
	}
	sort.SliceStable(dev.MIGProfiles, func(a, b int) bool {
		pa, pb := dev.MIGProfiles[a], dev.MIGProfiles[b]
		if pa.Slices != pb.Slices {
			return pa.Slices < pb.Slices
		}
		if pa.MemoryBytes != pb.MemoryBytes {
			return pa.MemoryBytes < pb.MemoryBytes
		}
		return pa.Name < pb.Name
	})
	if dev.MIG != node.MIGEnabled {
		return
	}
	max, ret := h.GetMaxMigDeviceCount()
	if !r.ok("get max mig device count", ret) {
		if r.lost == nil {
			d.warn("MIG devices of GPU %d: %v", dev.Index, nvmlError("get max mig device count", dev.Index, ret))
		}
		return
	}
	for k := range max {
		mh, ret := h.GetMigDeviceHandleByIndex(k)
		if ret == nvml.ERROR_NOT_FOUND || ret == nvml.ERROR_INVALID_ARGUMENT {
			continue // an empty slot
		}
		if !r.ok("get mig device handle", ret) {
			if r.lost == nil {
				d.warn("MIG device %d of GPU %d: %v", k, dev.Index, nvmlError("get mig device handle", dev.Index, ret))
			}
			continue
		}
		m, err := d.migDevice(h, mh, dev)
		if err != nil {
			d.warn("MIG device %d of GPU %d left out: %v", k, dev.Index, err)
			continue
		}
		dev.MIGDevices = append(dev.MIGDevices, m)
	}
	sort.Slice(dev.MIGDevices, func(a, b int) bool {
		ma, mb := dev.MIGDevices[a], dev.MIGDevices[b]
		if ma.GI != mb.GI {
			return ma.GI < mb.GI
		}
		return ma.CI < mb.CI
	})
}

// migDevice reads one MIG device of parent.
func (d *discovery) migDevice(parent, h nvml.Device, dev *node.Device) (node.MIGDevice, error) {
	m := node.MIGDevice{Parent: dev.Index, ParentUUID: dev.UUID, Health: node.Healthy()}
	uuid, ret := h.GetUUID()
	if ret != nvml.SUCCESS {
		return m, nvmlError("get mig uuid", dev.Index, ret)
	}
	m.UUID = uuid
	if m.GI, ret = h.GetGpuInstanceId(); ret != nvml.SUCCESS {
		return m, nvmlError("get gpu instance id", dev.Index, ret)
	}
	if m.CI, ret = h.GetComputeInstanceId(); ret != nvml.SUCCESS {
		return m, nvmlError("get compute instance id", dev.Index, ret)
	}
	giSlices, ciSlices := 0, 0
	if attrs, ret := h.GetAttributes(); ret == nvml.SUCCESS {
		m.SMs = int(attrs.MultiprocessorCount)
		m.MemoryBytes = attrs.MemorySizeMB * mib
		giSlices, ciSlices = int(attrs.GpuInstanceSliceCount), int(attrs.ComputeInstanceSliceCount)
	}
	if mem, ret := h.GetMemoryInfo(); ret == nvml.SUCCESS {
		m.MemoryBytes = mem.Total
	}
	m.ProfileID = -1
	if gi, ret := parent.GetGpuInstanceById(m.GI); ret == nvml.SUCCESS {
		if info, ret := gi.GetInfo(); ret == nvml.SUCCESS {
			m.ProfileID = int(info.ProfileId)
			m.Placement = node.MIGPlacement{Start: int(info.Placement.Start), Size: int(info.Placement.Size)}
		}
	}
	for _, p := range dev.MIGProfiles {
		if p.ID == m.ProfileID {
			m.Profile = p.Name
			giSlices = p.Slices
		}
	}
	if m.Profile == "" && giSlices > 0 {
		m.Profile = node.MIGProfileName(giSlices, m.MemoryBytes, "")
	}
	if ciSlices > 0 && giSlices > 0 && ciSlices < giSlices {
		m.Profile = strconv.Itoa(ciSlices) + "c." + m.Profile // a compute instance of part of its GPU instance
	}
	if dev.Minor >= 0 {
		m.GIAccess = d.capNode(node.MIGGIAccessName(dev.Minor, m.GI), filepath.Join(fmt.Sprintf("gpu%d", dev.Minor), "mig", fmt.Sprintf("gi%d", m.GI), "access"))
		m.CIAccess = d.capNode(node.MIGCIAccessName(dev.Minor, m.GI, m.CI), filepath.Join(fmt.Sprintf("gpu%d", dev.Minor), "mig", fmt.Sprintf("gi%d", m.GI), fmt.Sprintf("ci%d", m.CI), "access"))
	}
	return m, nil
}

// capNode finds the capability node of a MIG access capability: its minor
// from the nvidia-caps driver's mig-minors table (else the capability's
// own proc file), its major from /proc/devices, and the node under
// <dev>/nvidia-caps when it is there with those numbers. Without a minor it
// is the zero node, with a warning.
func (d *discovery) capNode(name, procFile string) node.DeviceNode {
	if d.migMinors == nil {
		d.migMinors = map[string]uint32{}
		b, err := os.ReadFile(filepath.Join(d.procRoot, "driver", "nvidia-caps", "mig-minors"))
		if err == nil {
			d.migMinors, err = node.ParseMIGMinors(string(b))
		}
		if err != nil {
			d.warn("MIG capability minors (capability nodes unknown): %v", err)
			d.migMinors = map[string]uint32{}
			d.noMIGMinors = true
		}
	}
	minor, ok := d.migMinors[name]
	if !ok {
		minor, ok = capFileMinor(filepath.Join(d.procRoot, "driver", "nvidia", "capabilities", procFile))
	}
	if !ok {
		if !d.noMIGMinors {
			d.warn("MIG capability %s: no minor number found", name)
		}
		return node.DeviceNode{}
	}
	path := filepath.Join(d.devRoot, node.NVIDIACapsDir, "nvidia-cap"+strconv.FormatUint(uint64(minor), 10))
	if num, err := linux.StatDevice(path); err == nil && num.Char && num.Minor == minor {
		return node.DeviceNode{Path: path, Major: num.Major, Minor: num.Minor}
	}
	major, ok := d.majors[node.NVIDIACaps]
	if !ok {
		d.warn("MIG capability %s: no %s major in /proc/devices", name, node.NVIDIACaps)
	}
	return node.DeviceNode{Path: path, Major: major, Minor: minor}
}

// capFileMinor reads "DeviceFileMinor: <M>" from a capability's proc file.
func capFileMinor(path string) (uint32, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "DeviceFileMinor:"); ok {
			m, err := strconv.ParseUint(strings.TrimSpace(v), 10, 20)
			return uint32(m), err == nil
		}
	}
	return 0, false
}
