package nvmlnode_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
)

func discoverHost(t *testing.T, sim *simnode.Node, h *simnode.Host) *node.Inventory {
	t.Helper()
	inv, err := nvmlnode.Discover(context.Background(), sim.DiscoverOptions(h)...)
	if err != nil {
		t.Fatal(err)
	}
	return inv
}

// TestControlDevices discovers the control nodes of a simulated host, as
// root: real device nodes read with stat, the dynamic major from the host's
// /proc/devices.
func TestControlDevices(t *testing.T) {
	testenv.RequireRoot(t)
	sim := newNode(t, "dgx1-volta")
	h, err := sim.MakeHost(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	dev := func(name string, major, minor uint32) node.ControlDevice {
		return node.ControlDevice{Name: name, Path: filepath.Join(h.DevRoot, name), Major: major, Minor: minor}
	}
	ctl := dev(node.NVIDIACtl, h.NVIDIAMajor, 255)
	uvm := dev(node.NVIDIAUVM, h.UVMMajor, 0)
	tools := dev(node.NVIDIAUVMTools, h.UVMMajor, 1)

	t.Run("all present", func(t *testing.T) {
		inv := discoverHost(t, sim, h)
		if want := []node.ControlDevice{ctl, uvm, tools}; !slices.Equal(inv.ControlDevices, want) {
			t.Fatalf("control devices = %+v, want %+v", inv.ControlDevices, want)
		}
		if len(inv.Warnings) != 0 {
			t.Fatalf("warnings: %q", inv.Warnings)
		}
	})
	t.Run("missing", func(t *testing.T) {
		if err := os.Remove(tools.Path); err != nil {
			t.Fatal(err)
		}
		inv := discoverHost(t, sim, h)
		if want := []node.ControlDevice{ctl, uvm}; !slices.Equal(inv.ControlDevices, want) {
			t.Fatalf("control devices = %+v, want %+v", inv.ControlDevices, want)
		}
	})
	t.Run("stale major", func(t *testing.T) {
		if err := os.Remove(uvm.Path); err != nil {
			t.Fatal(err)
		}
		if err := linux.Mknod(uvm.Path, 0o666, linux.DeviceNumber{Char: true, Major: h.UVMMajor + 1, Minor: 0}); err != nil {
			t.Fatal(err)
		}
		inv := discoverHost(t, sim, h)
		if want := []node.ControlDevice{ctl}; !slices.Equal(inv.ControlDevices, want) {
			t.Fatalf("control devices = %+v, want %+v", inv.ControlDevices, want)
		}
		if len(inv.Warnings) != 1 || !strings.Contains(inv.Warnings[0], "stale") {
			t.Fatalf("warnings = %q, want one about the stale sim", inv.Warnings)
		}
	})
}

// TestControlDevicesNotNodes needs no root: a regular file where a control
// sim should be is reported, not taken.
func TestControlDevicesNotNodes(t *testing.T) {
	devRoot := t.TempDir()
	if err := os.WriteFile(filepath.Join(devRoot, node.NVIDIACtl), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	inv, err := nvmlnode.Discover(context.Background(),
		nvmlnode.WithNVML(newNode(t, "pcie8").NVML()),
		nvmlnode.WithDevRoot(devRoot),
		nvmlnode.WithProcRoot(fixture(t, "hosts/no-driver/proc")))
	if err != nil {
		t.Fatal(err)
	}
	if len(inv.ControlDevices) != 0 || len(inv.Warnings) != 1 || !strings.Contains(inv.Warnings[0], node.NVIDIACtl) {
		t.Fatalf("control devices %+v, warnings %q: want none and one warning", inv.ControlDevices, inv.Warnings)
	}
}

// TestSimulatedNodesOpenENXIO opens each simulated GPU sim as root, with no
// device cgroup in the way: the open reaches the kernel, which has no NVIDIA
// driver behind major 195, and says ENXIO.
func TestSimulatedNodesOpenENXIO(t *testing.T) {
	testenv.RequireRoot(t)
	sim := newNode(t, "rtx8000x4")
	h, err := sim.MakeHost(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for i := range sim.Len() {
		p := filepath.Join(h.DevRoot, fmt.Sprintf("nvidia%d", sim.Minor(i)))
		num, err := linux.StatDevice(p)
		if err != nil || num != (linux.DeviceNumber{Char: true, Major: h.NVIDIAMajor, Minor: uint32(sim.Minor(i))}) {
			t.Fatalf("%s = %+v, %v", p, num, err)
		}
		f, err := os.OpenFile(p, os.O_RDWR, 0)
		if err == nil {
			f.Close()
			t.Fatalf("open %s succeeded: a driver answered", p)
		}
		if !errors.Is(err, syscall.ENXIO) {
			t.Fatalf("open %s = %v, want ENXIO", p, err)
		}
	}
}
