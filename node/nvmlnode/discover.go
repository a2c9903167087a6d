package nvmlnode

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuiso/gpuiso/node"
)

// Option configures Discover.
type Option func(*config) error

type config struct {
	lib      nvml.Interface
	devRoot  string
	procRoot string
	sysRoot  string
}

// WithNVML makes Discover read lib instead of the host's NVML library, which
// is otherwise loaded at run time (dlopen of libnvidia-ml.so.1), so that the
// same binary runs on nodes without a GPU.
func WithNVML(lib nvml.Interface) Option {
	return func(c *config) error {
		if lib == nil {
			return fmt.Errorf("nil NVML interface: %w", node.ErrInvalid)
		}
		c.lib = lib
		return nil
	}
}

// WithDevRoot sets the directory holding the device nodes (default /dev).
func WithDevRoot(dir string) Option {
	return rootOption("dev root", dir, func(c *config) *string { return &c.devRoot })
}

// WithProcRoot sets the proc file system's mount point (default /proc).
func WithProcRoot(dir string) Option {
	return rootOption("proc root", dir, func(c *config) *string { return &c.procRoot })
}

// WithSysRoot sets the sys file system's mount point (default /sys).
func WithSysRoot(dir string) Option {
	return rootOption("sys root", dir, func(c *config) *string { return &c.sysRoot })
}

func rootOption(what, dir string, field func(*config) *string) Option {
	return func(c *config) error {
		if dir == "" || !filepath.IsAbs(dir) {
			return fmt.Errorf("%s %q: must be an absolute path", what, dir)
		}
		*field(c) = filepath.Clean(dir)
		return nil
	}
}

// Discover reads the node's GPUs, their topology, the driver and the control
// devices through NVML, once. NVML is initialised and shut down inside the
// call.
//
// It fails with an error matching ErrLibraryNotFound when NVML is not
// installed and ErrDriverNotLoaded when the kernel driver is not loaded. A GPU
// that NVML cannot read does not fail discovery: it is reported unhealthy,
// with the error as the reason, beside the others.
func Discover(ctx context.Context, opts ...Option) (*node.Inventory, error) {
	c := config{devRoot: node.DefaultDevRoot, procRoot: node.DefaultProcRoot, sysRoot: node.DefaultSysRoot}
	for _, opt := range opts {
		if opt == nil {
			return nil, fmt.Errorf("discover: nil option: %w", node.ErrInvalid)
		}
		if err := opt(&c); err != nil {
			return nil, fmt.Errorf("discover: %w", err)
		}
	}
	if c.lib == nil {
		c.lib = nvml.New()
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("discover: %w", err)
	}
	if ret := c.lib.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("discover: %w", nvmlError("init", -1, ret))
	}
	defer c.lib.Shutdown()

	d := discovery{config: c, inv: &node.Inventory{}}
	if err := d.run(ctx); err != nil {
		return nil, fmt.Errorf("discover: %w", err)
	}
	return d.inv, nil
}

type discovery struct {
	config
	majors  map[string]uint32 // /proc/devices by driver name
	major   uint32            // the NVIDIA driver's major
	inv     *node.Inventory
	handles []nvml.Device // by position; nil for a device NVML did not hand out
	// migMinors is the nvidia-caps driver's mig-minors table, read on first
	// use; noMIGMinors says it could not be read (warned once).
	migMinors   map[string]uint32
	noMIGMinors bool
}

func (d *discovery) warn(format string, args ...any) {
	d.inv.Warnings = append(d.inv.Warnings, fmt.Sprintf(format, args...))
}

func (d *discovery) run(ctx context.Context) error {
	version, ret := d.lib.SystemGetDriverVersion()
	if ret != nvml.SUCCESS {
		return nvmlError("get driver version", -1, ret)
	}
	d.inv.DriverVersion = version
	if cuda, ret := d.lib.SystemGetCudaDriverVersion(); ret == nvml.SUCCESS {
		d.inv.CUDAVersion = node.CUDAVersion(cuda)
	} else {
		d.warn("CUDA driver version: %v", nvmlError("get cuda driver version", -1, ret))
	}

	d.readMajors()
	count, ret := d.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nvmlError("get device count", -1, ret)
	}
	for i := range count {
		if err := ctx.Err(); err != nil {
			return err
		}
		h, ret := d.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			// The GPU is there (NVML counted it) but cannot be read: keep
			// it, unhealthy, so it is neither lost from view nor handed out.
			d.inv.Devices = append(d.inv.Devices, node.Device{
				Index: i, Minor: node.NoMinor, NUMANode: node.NoNUMANode,
				Health: node.Unhealthy(nvmlError("get handle", i, ret).Error()),
			})
			d.handles = append(d.handles, nil)
			continue
		}
		dev := d.device(i, h)
		dev.Node = d.gpuNode(dev.Minor)
		d.inv.Devices = append(d.inv.Devices, dev)
		d.handles = append(d.handles, h)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	topo, err := d.topology()
	if err != nil {
		return err
	}
	d.inv.Topology = topo
	d.inv.ControlDevices = d.controlDevices()
	return nil
}

// reader reads one device's properties, turning the first "GPU is lost" into
// the device's health and every other failure into an absent value.
type reader struct {
	index int
	lost  error
}

// ok reports whether a call succeeded; a lost GPU makes it and every later
// call report false.
func (r *reader) ok(op string, ret nvml.Return) bool {
	if r.lost != nil {
		return false
	}
	if ret == nvml.ERROR_GPU_IS_LOST {
		r.lost = nvmlError(op, r.index, ret)
	}
	return ret == nvml.SUCCESS
}

const mib = 1 << 20

func (d *discovery) device(i int, h nvml.Device) node.Device {
	r := &reader{index: i}
	dev := node.Device{Index: i, Minor: node.NoMinor, NUMANode: node.NoNUMANode, Health: node.Healthy(), Attributes: node.Attributes{}}
	var problems []string
	required := func(what string, ret nvml.Return) bool {
		if r.ok(what, ret) {
			return true
		}
		if r.lost == nil {
			problems = append(problems, nvmlError(what, i, ret).Error())
		}
		return false
	}

	if uuid, ret := h.GetUUID(); required("get uuid", ret) {
		dev.UUID = uuid
	}
	if minor, ret := h.GetMinorNumber(); required("get minor number", ret) {
		dev.Minor = minor
	}
	if pci, ret := h.GetPciInfo(); required("get pci info", ret) {
		id, err := node.NormalizeBusID(cString(pci.BusId[:]))
		if err != nil {
			problems = append(problems, err.Error())
		}
		dev.BusID = id
	}
	if name, ret := h.GetName(); r.ok("get name", ret) {
		dev.Model = name
	}
	if brand, ret := h.GetBrand(); r.ok("get brand", ret) {
		dev.Brand = brandName(brand)
	}
	if arch, ret := h.GetArchitecture(); r.ok("get architecture", ret) {
		dev.Architecture = architectureName(arch)
	}
	if major, minor, ret := h.GetCudaComputeCapability(); r.ok("get compute capability", ret) {
		dev.ComputeCapability = fmt.Sprintf("%d.%d", major, minor)
	}
	if mem, ret := h.GetMemoryInfo(); r.ok("get memory info", ret) {
		dev.MemoryBytes = mem.Total
		dev.Attributes[node.AttrMemory] = node.IntAttribute(int64(mem.Total/mib), node.UnitMiB)
	}
	if node, ret := h.GetNumaNodeId(); r.ok("get numa node", ret) && node >= 0 {
		dev.NUMANode = node
	} else if r.lost == nil && dev.BusID != "" {
		dev.NUMANode = d.sysfsNUMANode(dev.BusID)
	}
	if current, _, ret := h.GetMigMode(); r.ok("get mig mode", ret) {
		dev.MIG = node.MIGDisabled
		if current == nvml.DEVICE_MIG_ENABLE {
			dev.MIG = node.MIGEnabled
		}
	} else if ret == nvml.ERROR_NOT_SUPPORTED {
		dev.MIG = node.MIGUnsupported
	}
	d.attributes(r, h, dev.Attributes)
	d.mig(r, h, &dev)

	switch {
	case r.lost != nil:
		dev.Health = node.Unhealthy(r.lost.Error())
	case len(problems) > 0:
		dev.Health = node.Unhealthy(strings.Join(problems, "; "))
	}
	if len(dev.Attributes) == 0 {
		dev.Attributes = nil
	}
	return dev
}

// attributes reads Nomad's fingerprint attributes; each one NVML cannot read
// stays absent.
func (d *discovery) attributes(r *reader, h nvml.Device, attrs node.Attributes) {
	if bar1, ret := h.GetBAR1MemoryInfo(); r.ok("get bar1", ret) {
		attrs[node.AttrBAR1] = node.IntAttribute(int64(bar1.Bar1Total/mib), node.UnitMiB)
	}
	if mw, ret := h.GetPowerManagementLimit(); r.ok("get power limit", ret) {
		attrs[node.AttrPower] = node.IntAttribute(int64(mw/1000), node.UnitW)
	}
	if mhz, ret := h.GetMaxClockInfo(nvml.CLOCK_SM); r.ok("get sm clock", ret) {
		attrs[node.AttrCoresClock] = node.IntAttribute(int64(mhz), node.UnitMHz)
	}
	if mhz, ret := h.GetMaxClockInfo(nvml.CLOCK_MEM); r.ok("get memory clock", ret) {
		attrs[node.AttrMemoryClock] = node.IntAttribute(int64(mhz), node.UnitMHz)
	}
	gen, ret1 := h.GetMaxPcieLinkGeneration()
	if r.ok("get pcie generation", ret1) {
		if width, ret := h.GetMaxPcieLinkWidth(); r.ok("get pcie width", ret) {
			if perLane, known := pcieLaneMBps[gen]; known && width > 0 {
				attrs[node.AttrPCIBandwidth] = node.IntAttribute(int64(perLane*width), node.UnitMBps)
			}
		}
	}
	if mode, ret := h.GetDisplayMode(); r.ok("get display mode", ret) {
		attrs[node.AttrDisplayState] = node.StringAttribute(enableState(mode))
	}
	if mode, ret := h.GetPersistenceMode(); r.ok("get persistence mode", ret) {
		attrs[node.AttrPersistenceMode] = node.StringAttribute(enableState(mode))
	}
	if r.lost == nil && d.inv.DriverVersion != "" {
		attrs[node.AttrDriverVersion] = node.StringAttribute(d.inv.DriverVersion)
	}
}

// pcieLaneMBps is the usable bandwidth of one PCIe lane per generation, MB/s.
var pcieLaneMBps = map[int]int{1: 250, 2: 500, 3: 985, 4: 1969, 5: 3938, 6: 7563}

// sysfsNUMANode reads the NUMA node of a PCI device from sysfs, for drivers
// that do not report it through NVML.
func (d *discovery) sysfsNUMANode(busID string) int {
	b, err := os.ReadFile(filepath.Join(d.sysRoot, "bus", "pci", "devices", busID, "numa_node"))
	if err != nil {
		return node.NoNUMANode
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n < 0 {
		return node.NoNUMANode
	}
	return n
}

// maxNVLinks is the number of NVLink ports NVML can report per GPU.
const maxNVLinks = nvml.NVLINK_MAX_LINKS

// topology reads every pair's PCIe level and every GPU's NVLinks. Lost GPUs
// get unknown links and do not break the others'.
func (d *discovery) topology() (*node.Topology, error) {
	n := len(d.inv.Devices)
	links := make([][]node.Link, n)
	for i := range links {
		links[i] = make([]node.Link, n)
	}
	usable := func(i int) bool { return d.handles[i] != nil && d.inv.Devices[i].Health.Healthy }

	for i := range n {
		for j := i + 1; j < n; j++ {
			if !usable(i) || !usable(j) {
				continue
			}
			level, ret := d.handles[i].GetTopologyCommonAncestor(d.handles[j])
			if ret != nvml.SUCCESS {
				d.warn("PCIe relation of GPUs %d and %d: %v", i, j, nvmlError("get topology common ancestor", i, ret))
				continue
			}
			links[i][j].PCIe = pcieLevel(level)
			links[j][i].PCIe = links[i][j].PCIe
		}
	}

	byBusID := map[string]int{}
	for i, dev := range d.inv.Devices {
		if usable(i) && dev.BusID != "" {
			byBusID[dev.BusID] = i
		}
	}
	switchLinks := make([]int, n)
	peer := make([][]int, n) // peer[i][j]: links i reports to j
	for i := range n {
		peer[i] = make([]int, n)
		if !usable(i) {
			continue
		}
		h := d.handles[i]
		for l := range maxNVLinks {
			state, ret := h.GetNvLinkState(l)
			if ret != nvml.SUCCESS || state != nvml.FEATURE_ENABLED {
				continue
			}
			remote, ret := h.GetNvLinkRemotePciInfo(l)
			if ret != nvml.SUCCESS {
				d.warn("NVLink %d of GPU %d: %v", l, i, nvmlError("get nvlink remote pci info", i, ret))
				continue
			}
			busID, _ := node.NormalizeBusID(cString(remote.BusId[:]))
			kind, kindRet := h.GetNvLinkRemoteDeviceType(l)
			j, isGPU := byBusID[busID]
			switch {
			case kindRet == nvml.SUCCESS && kind == nvml.NVLINK_DEVICE_TYPE_SWITCH:
				switchLinks[i]++
			case isGPU && j != i:
				peer[i][j]++
			case kindRet != nvml.SUCCESS || kind == nvml.NVLINK_DEVICE_TYPE_UNKNOWN:
				// Older drivers cannot name the far end: what is not one of
				// our GPUs is taken for a switch.
				switchLinks[i]++
			}
		}
	}
	for i := range n {
		for j := i + 1; j < n; j++ {
			nv := max(peer[i][j], peer[j][i])
			// NVSwitch systems: every GPU reaches every other through the
			// switches, with as many links as the lesser side has.
			nv += min(switchLinks[i], switchLinks[j])
			links[i][j].NVLinks, links[j][i].NVLinks = nv, nv
		}
	}
	return node.NewTopology(links)
}

func pcieLevel(l nvml.GpuTopologyLevel) node.PCIeLevel {
	switch l {
	case nvml.TOPOLOGY_INTERNAL:
		return node.PCIeSameBoard
	case nvml.TOPOLOGY_SINGLE:
		return node.PCIeSingleSwitch
	case nvml.TOPOLOGY_MULTIPLE:
		return node.PCIeMultipleSwitches
	case nvml.TOPOLOGY_HOSTBRIDGE:
		return node.PCIeHostBridge
	case nvml.TOPOLOGY_NODE:
		return node.PCIeNode
	case nvml.TOPOLOGY_SYSTEM:
		return node.PCIeSystem
	}
	return node.PCIeUnknown
}

// cString reads a NUL-terminated C string out of NVML's fixed-size arrays.
func cString[T int8 | uint8](b []T) string {
	var sb strings.Builder
	for _, c := range b {
		if c == 0 {
			break
		}
		sb.WriteByte(byte(c))
	}
	return sb.String()
}

func enableState(s nvml.EnableState) string {
	if s == nvml.FEATURE_ENABLED {
		return "Enabled"
	}
	return "Disabled"
}

func brandName(b nvml.BrandType) string {
	switch b {
	case nvml.BRAND_QUADRO:
		return "Quadro"
	case nvml.BRAND_TESLA:
		return "Tesla"
	case nvml.BRAND_NVS:
		return "NVS"
	case nvml.BRAND_GRID:
		return "GRID"
	case nvml.BRAND_GEFORCE:
		return "GeForce"
	case nvml.BRAND_TITAN:
		return "Titan"
	case nvml.BRAND_QUADRO_RTX:
		return "Quadro RTX"
	case nvml.BRAND_NVIDIA_RTX:
		return "NVIDIA RTX"
	case nvml.BRAND_NVIDIA:
		return "NVIDIA"
	case nvml.BRAND_GEFORCE_RTX:
		return "GeForce RTX"
	case nvml.BRAND_TITAN_RTX:
		return "Titan RTX"
	}
	return ""
}

func architectureName(a nvml.DeviceArchitecture) string {
	switch a {
	case nvml.DEVICE_ARCH_KEPLER:
		return "kepler"
	case nvml.DEVICE_ARCH_MAXWELL:
		return "maxwell"
	case nvml.DEVICE_ARCH_PASCAL:
		return "pascal"
	case nvml.DEVICE_ARCH_VOLTA:
		return "volta"
	case nvml.DEVICE_ARCH_TURING:
		return "turing"
	case nvml.DEVICE_ARCH_AMPERE:
		return "ampere"
	case nvml.DEVICE_ARCH_ADA:
		return "ada"
	case nvml.DEVICE_ARCH_HOPPER:
		return "hopper"
	case nvml.DEVICE_ARCH_BLACKWELL:
		return "blackwell"
	}
	return ""
}
