package nvmlnode_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
)

// discoverSim discovers a simulated sim with an empty dev root and the
// "dgx-a100" fixture's /proc, so nothing of the real host leaks in.
func discoverSim(t *testing.T, lib nvml.Interface) *node.Inventory {
	t.Helper()
	inv, err := nvmlnode.Discover(context.Background(),
		nvmlnode.WithNVML(lib),
		nvmlnode.WithDevRoot(t.TempDir()),
		nvmlnode.WithProcRoot(fixture(t, "hosts/dgx-a100/proc")),
		nvmlnode.WithSysRoot(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	return inv
}

func fixture(t *testing.T, rel string) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("..", "..", "testdata", rel))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func newNode(t *testing.T, name string) *simnode.Node {
	t.Helper()
	n, err := simnode.New(name, simnode.WithDriverVersion("535.104.05"))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestDiscoverShippedTopologies discovers every shipped topology and checks
// each GPU's identity and attributes and the whole topology against the
// description.
func TestDiscoverShippedTopologies(t *testing.T) {
	for _, name := range simnode.Names() {
		t.Run(name, func(t *testing.T) {
			sim := newNode(t, name)
			spec := sim.Spec()
			inv := discoverSim(t, sim.NVML())

			if inv.DriverVersion != "535.104.05" || inv.CUDAVersion.String() != "12.2" {
				t.Errorf("driver %q CUDA %q, want 535.104.05 and 12.2", inv.DriverVersion, inv.CUDAVersion)
			}
			if len(inv.Devices) != len(spec.GPUs) {
				t.Fatalf("%d devices, want %d", len(inv.Devices), len(spec.GPUs))
			}
			for i, d := range inv.Devices {
				g := spec.GPUs[i]
				if d.Index != i || d.Minor != sim.Minor(i) || d.UUID != sim.UUID(i) || d.BusID != g.BusID {
					t.Errorf("device %d identity = index %d minor %d uuid %s bus %s, want %d %d %s %s",
						i, d.Index, d.Minor, d.UUID, d.BusID, i, sim.Minor(i), sim.UUID(i), g.BusID)
				}
				if d.Model != spec.GPU.Model || d.Architecture != spec.GPU.Architecture ||
					d.ComputeCapability != spec.GPU.ComputeCapability || d.NUMANode != g.NUMANode {
					t.Errorf("device %d = %s %s cc %s numa %d, want %s %s cc %s numa %d", i, d.Model, d.Architecture,
						d.ComputeCapability, d.NUMANode, spec.GPU.Model, spec.GPU.Architecture, spec.GPU.ComputeCapability, g.NUMANode)
				}
				if d.MemoryBytes != uint64(spec.GPU.MemoryMiB)<<20 || !d.Health.Healthy {
					t.Errorf("device %d memory %d health %v", i, d.MemoryBytes, d.Health)
				}
				if a := d.Attributes[node.AttrMemory]; a.Kind != node.KindInt || a.Int != int64(spec.GPU.MemoryMiB) || a.Unit != "MiB" {
					t.Errorf("device %d memory attribute = %+v", i, a)
				}
				wantMIG := node.MIGUnsupported
				switch {
				case g.MIG != nil:
					wantMIG = node.MIGEnabled
				case spec.GPU.MIGCapable:
					wantMIG = node.MIGDisabled
				}
				if d.MIG != wantMIG {
					t.Errorf("device %d MIG = %q, want %q", i, d.MIG, wantMIG)
				}
				checkMIG(t, sim, d)
			}
			want, err := spec.Topology()
			if err != nil {
				t.Fatal(err)
			}
			for i := range inv.Devices {
				for j := range inv.Devices {
					if got, want := inv.Topology.Link(i, j), want.Link(i, j); got != want {
						t.Errorf("link %d-%d = %+v, want %+v", i, j, got, want)
					}
				}
			}
			if len(inv.Warnings) != 0 {
				t.Errorf("warnings: %q", inv.Warnings)
			}
		})
	}
}

// TestDiscoverPublishedTopologies pins the link matrices to the published
// hardware, independently of the simulator's own description.
func TestDiscoverPublishedTopologies(t *testing.T) {
	t.Run("dgx1-volta hybrid cube-mesh", func(t *testing.T) {
		inv := discoverSim(t, newNode(t, "dgx1-volta").NVML())
		nv := map[[2]int]int{
			{0, 1}: 1, {0, 2}: 1, {0, 3}: 2, {0, 4}: 2, {1, 2}: 2, {1, 3}: 1, {1, 5}: 2, {2, 3}: 2,
			{2, 6}: 1, {3, 7}: 1, {4, 5}: 1, {4, 6}: 1, {4, 7}: 2, {5, 6}: 2, {5, 7}: 1, {6, 7}: 2,
		}
		for i := range 8 {
			for j := i + 1; j < 8; j++ {
				l := inv.Topology.Link(i, j)
				if l.NVLinks != nv[[2]int{i, j}] {
					t.Errorf("NVLinks %d-%d = %d, want %d", i, j, l.NVLinks, nv[[2]int{i, j}])
				}
				var pcie node.PCIeLevel
				switch {
				case i/2 == j/2:
					pcie = node.PCIeSingleSwitch
				case i/4 == j/4:
					pcie = node.PCIeHostBridge
				default:
					pcie = node.PCIeSystem
				}
				if l.PCIe != pcie {
					t.Errorf("PCIe %d-%d = %v, want %v", i, j, l.PCIe, pcie)
				}
			}
		}
	})
	allToAll := []struct {
		name  string
		gpus  int
		links int
	}{{"dgx-a100", 8, 12}, {"hgx-h100", 8, 18}, {"dgx2", 16, 6}}
	for _, tt := range allToAll {
		t.Run(tt.name+" NVSwitch all-to-all", func(t *testing.T) {
			inv := discoverSim(t, newNode(t, tt.name).NVML())
			if len(inv.Devices) != tt.gpus {
				t.Fatalf("%d GPUs, want %d", len(inv.Devices), tt.gpus)
			}
			for i := range tt.gpus {
				for j := i + 1; j < tt.gpus; j++ {
					if n := inv.Topology.Link(i, j).NVLinks; n != tt.links {
						t.Errorf("NVLinks %d-%d = %d, want %d", i, j, n, tt.links)
					}
				}
			}
		})
	}
	t.Run("rtx8000x4 bridged pairs", func(t *testing.T) {
		inv := discoverSim(t, newNode(t, "rtx8000x4").NVML())
		for i := range 4 {
			for j := i + 1; j < 4; j++ {
				want := 0
				if (i == 0 && j == 3) || (i == 1 && j == 2) {
					want = 2
				}
				if n := inv.Topology.Link(i, j).NVLinks; n != want {
					t.Errorf("NVLinks %d-%d = %d, want %d", i, j, n, want)
				}
			}
		}
	})
	t.Run("pcie8 two sockets", func(t *testing.T) {
		inv := discoverSim(t, newNode(t, "pcie8").NVML())
		if l := inv.Topology.Link(0, 4); l != (node.Link{PCIe: node.PCIeSystem}) {
			t.Errorf("link 0-4 = %+v, want SYS and no NVLink", l)
		}
		if l := inv.Topology.Link(0, 1); l != (node.Link{PCIe: node.PCIeSingleSwitch}) {
			t.Errorf("link 0-1 = %+v, want PIX and no NVLink", l)
		}
	})
}

func TestDiscoverLostGPU(t *testing.T) {
	sim := newNode(t, "dgx1-volta")
	if err := sim.Lose(3); err != nil {
		t.Fatal(err)
	}
	inv := discoverSim(t, sim.NVML())
	if len(inv.Devices) != 8 {
		t.Fatalf("%d devices, want all 8", len(inv.Devices))
	}
	lost := inv.Devices[3]
	if lost.Health.Healthy || !strings.Contains(lost.Health.Reason, "ERROR_GPU_IS_LOST") || lost.Index != 3 {
		t.Fatalf("lost GPU = %+v, want unhealthy with the NVML error", lost)
	}
	if lost.Attributes != nil || lost.Minor != node.NoMinor {
		t.Errorf("lost GPU reports attributes %v and minor %d it could not read", lost.Attributes, lost.Minor)
	}
	if got := inv.Healthy(); len(got) != 7 {
		t.Errorf("healthy = %v, want the 7 others", got)
	}
	for i, d := range inv.Devices {
		if i != 3 && (!d.Health.Healthy || d.UUID != sim.UUID(i)) {
			t.Errorf("device %d = %+v, want healthy and identified", i, d)
		}
	}
	if l := inv.Topology.Link(0, 3); l != (node.Link{}) {
		t.Errorf("link to the lost GPU = %+v, want unknown", l)
	}
	if l := inv.Topology.Link(0, 1); l != (node.Link{PCIe: node.PCIeSingleSwitch, NVLinks: 1}) {
		t.Errorf("link 0-1 = %+v, want PIX NV1 despite the lost GPU", l)
	}
}

// handleFails makes NVML refuse the handle of one GPU.
type handleFails struct {
	nvml.Interface
	index int
}

func (h handleFails) DeviceGetHandleByIndex(i int) (nvml.Device, nvml.Return) {
	if i == h.index {
		return nil, nvml.ERROR_GPU_IS_LOST
	}
	return h.Interface.DeviceGetHandleByIndex(i)
}

func TestDiscoverHandleOfLostGPU(t *testing.T) {
	inv := discoverSim(t, handleFails{newNode(t, "hgx-h100").NVML(), 5})
	if len(inv.Devices) != 8 || inv.Devices[5].Health.Healthy || inv.Devices[5].Index != 5 {
		t.Fatalf("devices = %+v, want 8 with GPU 5 unhealthy", inv.Devices)
	}
	if n := inv.Topology.Link(0, 1).NVLinks; n != 18 {
		t.Errorf("NVLinks 0-1 = %d, want 18", n)
	}
}

func TestDiscoverInitErrors(t *testing.T) {
	tests := []struct {
		name string
		ret  nvml.Return
		want error
	}{
		{"library missing", nvml.ERROR_LIBRARY_NOT_FOUND, nvmlnode.ErrLibraryNotFound},
		{"driver not loaded", nvml.ERROR_DRIVER_NOT_LOADED, nvmlnode.ErrDriverNotLoaded},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lib := &mock.Interface{InitFunc: func() nvml.Return { return tt.ret }}
			_, err := nvmlnode.Discover(context.Background(), nvmlnode.WithNVML(lib))
			if !errors.Is(err, tt.want) {
				t.Fatalf("Discover = %v, want %v", err, tt.want)
			}
			var nerr *nvmlnode.NVMLError
			if !errors.As(err, &nerr) || nerr.Return != tt.ret {
				t.Fatalf("Discover = %v, want an *NVMLError carrying %v", err, tt.ret)
			}
		})
	}
}

// TestDiscoverLibraryMissing loads NVML for real from a path that has no
// library: go-nvml's dlopen fails and discovery says so.
func TestDiscoverLibraryMissing(t *testing.T) {
	lib := nvml.New(nvml.WithLibraryPath(filepath.Join(t.TempDir(), "libnvidia-ml.so.1")))
	_, err := nvmlnode.Discover(context.Background(), nvmlnode.WithNVML(lib))
	if !errors.Is(err, nvmlnode.ErrLibraryNotFound) {
		t.Fatalf("Discover = %v, want ErrLibraryNotFound", err)
	}
}

// TestDiscoverDriverNotLoaded loads the host's real NVML library, which
// cannot reach a kernel driver on the test hosts.
func TestDiscoverDriverNotLoaded(t *testing.T) {
	testenv.RequireNVIDIALibraries(t)
	if _, err := os.Stat("/proc/driver/nvidia/version"); err == nil {
		t.Skip("the NVIDIA kernel driver is loaded here: TestDiscoverRealGPU covers this host")
	}
	_, err := nvmlnode.Discover(context.Background())
	if !errors.Is(err, nvmlnode.ErrDriverNotLoaded) {
		t.Fatalf("Discover = %v, want ErrDriverNotLoaded", err)
	}
}

// TestDiscoverRealGPU is the hardware suite: on a sim with GPUs, discovery
// finds them all healthy and identified.
func TestDiscoverRealGPU(t *testing.T) {
	testenv.RequireGPU(t)
	inv, err := nvmlnode.Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(inv.Devices) == 0 || inv.DriverVersion == "" || inv.CUDAVersion == 0 {
		t.Fatalf("inventory = %+v, want GPUs and a driver", inv)
	}
	for _, d := range inv.Devices {
		if d.UUID == "" || d.BusID == "" || d.Minor < 0 || d.MemoryBytes == 0 {
			t.Errorf("device %d not fully identified: %+v", d.Index, d)
		}
		t.Logf("GPU %d: %s %s minor %d %s %d MiB NUMA %d %v", d.Index, d.Model, d.BusID, d.Minor, d.UUID, d.MemoryBytes>>20, d.NUMANode, d.Health)
	}
	if !strings.Contains(strings.Join(controlNames(inv), ","), node.NVIDIACtl) {
		t.Errorf("control devices %v lack nvidiactl", inv.ControlDevices)
	}
}

func controlNames(inv *node.Inventory) []string {
	var names []string
	for _, c := range inv.ControlDevices {
		names = append(names, c.Name)
	}
	return names
}

func TestDiscoverOptionsValidate(t *testing.T) {
	for _, opt := range []nvmlnode.Option{nvmlnode.WithDevRoot("relative/dev"), nvmlnode.WithProcRoot(""), nvmlnode.WithNVML(nil)} {
		if _, err := nvmlnode.Discover(context.Background(), opt); err == nil {
			t.Errorf("Discover accepted an invalid option")
		}
	}
}

func TestDiscoverCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := nvmlnode.Discover(ctx, nvmlnode.WithNVML(newNode(t, "pcie8").NVML())); !errors.Is(err, context.Canceled) {
		t.Fatalf("Discover = %v, want context.Canceled", err)
	}
}
