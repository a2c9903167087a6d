package simnode

import (
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/gpuiso/gpuiso/node"
)

const mib = 1 << 20

// newDevice builds GPU i's NVML device. Every answer comes from the spec, so
// it is the same in every run.
func (n *Node) newDevice(i int) *mock.Device {
	g, m := n.spec.GPUs[i], n.spec.GPU
	d := &mock.Device{}
	enabled := func(on bool) nvml.EnableState {
		if on {
			return nvml.FEATURE_ENABLED
		}
		return nvml.FEATURE_DISABLED
	}
	d.GetIndexFunc = func() (int, nvml.Return) { return i, nvml.SUCCESS }
	d.GetUUIDFunc = func() (string, nvml.Return) { return n.UUID(i), nvml.SUCCESS }
	d.GetMinorNumberFunc = func() (int, nvml.Return) { return n.spec.minor(i), nvml.SUCCESS }
	d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) { return pciInfo(g.BusID), nvml.SUCCESS }
	d.GetNameFunc = func() (string, nvml.Return) { return m.Model, nvml.SUCCESS }
	d.GetBrandFunc = func() (nvml.BrandType, nvml.Return) { return brandType(m.Brand), nvml.SUCCESS }
	d.GetArchitectureFunc = func() (nvml.DeviceArchitecture, nvml.Return) {
		return architecture(m.Architecture), nvml.SUCCESS
	}
	d.GetCudaComputeCapabilityFunc = func() (int, int, nvml.Return) {
		major, minor, _ := strings.Cut(m.ComputeCapability, ".")
		ma, _ := strconv.Atoi(major)
		mi, _ := strconv.Atoi(minor)
		return ma, mi, nvml.SUCCESS
	}
	d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
		total := uint64(m.MemoryMiB) * mib
		return nvml.Memory{Total: total, Free: total}, nvml.SUCCESS
	}
	d.GetNumaNodeIdFunc = func() (int, nvml.Return) { return g.NUMANode, nvml.SUCCESS }
	n.addMIG(i, d)
	if m.BAR1MiB > 0 {
		d.GetBAR1MemoryInfoFunc = func() (nvml.BAR1Memory, nvml.Return) {
			total := uint64(m.BAR1MiB) * mib
			return nvml.BAR1Memory{Bar1Total: total, Bar1Free: total}, nvml.SUCCESS
		}
	}
	if m.PowerW > 0 {
		d.GetPowerManagementLimitFunc = func() (uint32, nvml.Return) { return uint32(m.PowerW) * 1000, nvml.SUCCESS }
	}
	d.GetMaxClockInfoFunc = func(c nvml.ClockType) (uint32, nvml.Return) {
		switch {
		case c == nvml.CLOCK_SM && m.CoresClockMHz > 0:
			return uint32(m.CoresClockMHz), nvml.SUCCESS
		case c == nvml.CLOCK_MEM && m.MemoryClockMHz > 0:
			return uint32(m.MemoryClockMHz), nvml.SUCCESS
		}
		return 0, nvml.ERROR_NOT_SUPPORTED
	}
	if m.PCIeGeneration > 0 && m.PCIeWidth > 0 {
		d.GetMaxPcieLinkGenerationFunc = func() (int, nvml.Return) { return m.PCIeGeneration, nvml.SUCCESS }
		d.GetMaxPcieLinkWidthFunc = func() (int, nvml.Return) { return m.PCIeWidth, nvml.SUCCESS }
	}
	d.GetDisplayModeFunc = func() (nvml.EnableState, nvml.Return) { return enabled(m.DisplayMode), nvml.SUCCESS }
	d.GetDisplayActiveFunc = func() (nvml.EnableState, nvml.Return) { return nvml.FEATURE_DISABLED, nvml.SUCCESS }
	d.GetPersistenceModeFunc = func() (nvml.EnableState, nvml.Return) {
		return enabled(m.PersistenceMode), nvml.SUCCESS
	}

	// Topology: the PCIe relation comes from the tree; NVLinks are laid out
	// as ports, direct links first, then the links to the NVSwitches.
	d.GetTopologyCommonAncestorFunc = func(other nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) {
		j := n.indexOf(other)
		if j < 0 {
			return 0, nvml.ERROR_INVALID_ARGUMENT
		}
		if n.isLost(j) {
			return 0, nvml.ERROR_GPU_IS_LOST
		}
		if j == i {
			return nvml.TOPOLOGY_INTERNAL, nvml.SUCCESS
		}
		return topologyLevel(n.spec.pcie(i, j)), nvml.SUCCESS
	}
	ports := n.nvlinkPorts(i)
	port := func(l int) (nvLinkPort, nvml.Return) {
		if l < 0 || l >= nvml.NVLINK_MAX_LINKS {
			return nvLinkPort{}, nvml.ERROR_INVALID_ARGUMENT
		}
		if l >= len(ports) {
			return nvLinkPort{}, nvml.ERROR_NOT_SUPPORTED
		}
		return ports[l], nvml.SUCCESS
	}
	d.GetNvLinkStateFunc = func(l int) (nvml.EnableState, nvml.Return) {
		_, ret := port(l)
		if ret != nvml.SUCCESS {
			return 0, ret
		}
		return nvml.FEATURE_ENABLED, nvml.SUCCESS
	}
	d.GetNvLinkRemotePciInfoFunc = func(l int) (nvml.PciInfo, nvml.Return) {
		p, ret := port(l)
		return pciInfo(p.busID), ret
	}
	d.GetNvLinkRemoteDeviceTypeFunc = func(l int) (nvml.IntNvLinkDeviceType, nvml.Return) {
		p, ret := port(l)
		if p.toSwitch {
			return nvml.NVLINK_DEVICE_TYPE_SWITCH, ret
		}
		return nvml.NVLINK_DEVICE_TYPE_GPU, ret
	}

	// Processes using the GPU, as tests set them.
	d.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return n.processes(i), nvml.SUCCESS }
	d.GetGraphicsRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.SUCCESS }
	d.GetProcessUtilizationFunc = func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) { return n.utilization(i) }

	// Health events.
	d.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) { return supportedEvents, nvml.SUCCESS }
	d.RegisterEventsFunc = func(types uint64, set nvml.EventSet) nvml.Return { return n.register(i, types, set) }
	n.healthCalls(d, i)

	fillNotSupported(d)
	guardLost(d, func() bool { return n.isLost(i) })
	return d
}

type nvLinkPort struct {
	busID    string
	toSwitch bool
}

// nvlinkPorts lays out GPU i's NVLink ports.
func (n *Node) nvlinkPorts(i int) []nvLinkPort {
	var ports []nvLinkPort
	for _, l := range n.spec.NVLinks {
		peer := -1
		switch i {
		case l[0]:
			peer = l[1]
		case l[1]:
			peer = l[0]
		}
		for range l[2] * boolInt(peer >= 0) {
			ports = append(ports, nvLinkPort{busID: n.spec.GPUs[peer].BusID})
		}
	}
	for k := range n.spec.NVSwitchLinks {
		// NVSwitches sit on their own PCI addresses, past the GPUs'.
		ports = append(ports, nvLinkPort{busID: "0000:ff:" + twoHex(k%6) + ".0", toSwitch: true})
	}
	return ports
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func twoHex(v int) string {
	s := strconv.FormatInt(int64(v), 16)
	if len(s) < 2 {
		s = "0" + s
	}
	return s
}

func (n *Node) indexOf(d nvml.Device) int {
	for i, own := range n.devices {
		if nvml.Device(own) == d {
			return i
		}
	}
	return -1
}

// pciInfo fills NVML's PCI info with a bus id in NVML's own 8-digit-domain
// upper-case form, which discovery must normalise.
func pciInfo(busID string) nvml.PciInfo {
	var p nvml.PciInfo
	if busID == "" {
		return p
	}
	nv := strings.ToUpper("0000" + busID)
	for k := 0; k < len(nv) && k < len(p.BusId)-1; k++ {
		p.BusId[k] = int8(nv[k])
	}
	for k := 0; k < len(p.BusIdLegacy)-1 && k < len(busID); k++ {
		p.BusIdLegacy[k] = int8(strings.ToUpper(busID)[k])
	}
	dom, _ := strconv.ParseUint(busID[:4], 16, 32)
	bus, _ := strconv.ParseUint(busID[5:7], 16, 32)
	dev, _ := strconv.ParseUint(busID[8:10], 16, 32)
	p.Domain, p.Bus, p.Device = uint32(dom), uint32(bus), uint32(dev)
	return p
}

func topologyLevel(l node.PCIeLevel) nvml.GpuTopologyLevel {
	switch l {
	case node.PCIeSameBoard:
		return nvml.TOPOLOGY_INTERNAL
	case node.PCIeSingleSwitch:
		return nvml.TOPOLOGY_SINGLE
	case node.PCIeMultipleSwitches:
		return nvml.TOPOLOGY_MULTIPLE
	case node.PCIeHostBridge:
		return nvml.TOPOLOGY_HOSTBRIDGE
	case node.PCIeNode:
		return nvml.TOPOLOGY_NODE
	}
	return nvml.TOPOLOGY_SYSTEM
}

func brandType(b string) nvml.BrandType {
	switch strings.ToLower(b) {
	case "quadro":
		return nvml.BRAND_QUADRO
	case "tesla":
		return nvml.BRAND_TESLA
	case "geforce":
		return nvml.BRAND_GEFORCE
	case "titan":
		return nvml.BRAND_TITAN
	case "nvidia":
		return nvml.BRAND_NVIDIA
	case "nvidia rtx":
		return nvml.BRAND_NVIDIA_RTX
	}
	return nvml.BRAND_UNKNOWN
}

func architecture(a string) nvml.DeviceArchitecture {
	switch a {
	case "kepler":
		return nvml.DEVICE_ARCH_KEPLER
	case "maxwell":
		return nvml.DEVICE_ARCH_MAXWELL
	case "pascal":
		return nvml.DEVICE_ARCH_PASCAL
	case "volta":
		return nvml.DEVICE_ARCH_VOLTA
	case "turing":
		return nvml.DEVICE_ARCH_TURING
	case "ampere":
		return nvml.DEVICE_ARCH_AMPERE
	case "ada":
		return nvml.DEVICE_ARCH_ADA
	case "hopper":
		return nvml.DEVICE_ARCH_HOPPER
	case "blackwell":
		return nvml.DEVICE_ARCH_BLACKWELL
	}
	return nvml.DEVICE_ARCH_UNKNOWN
}
