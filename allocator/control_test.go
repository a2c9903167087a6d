package allocator_test

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

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/allocator/simnode"
	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/internal/testenv"
)

func discoverHost(t *testing.T, node *simnode.Node, h *simnode.Host) *allocator.Inventory {
	t.Helper()
	inv, err := allocator.Discover(context.Background(), node.DiscoverOptions(h)...)
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
	node := newNode(t, "dgx1-volta")
	h, err := node.MakeHost(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	dev := func(name string, major, minor uint32) allocator.ControlDevice {
		return allocator.ControlDevice{Name: name, Path: filepath.Join(h.DevRoot, name), Major: major, Minor: minor}
	}
	ctl := dev(allocator.NVIDIACtl, 195, 255)
	uvm := dev(allocator.NVIDIAUVM, h.UVMMajor, 0)
	tools := dev(allocator.NVIDIAUVMTools, h.UVMMajor, 1)

	t.Run("all present", func(t *testing.T) {
		inv := discoverHost(t, node, h)
		if want := []allocator.ControlDevice{ctl, uvm, tools}; !slices.Equal(inv.ControlDevices, want) {
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
		inv := discoverHost(t, node, h)
		if want := []allocator.ControlDevice{ctl, uvm}; !slices.Equal(inv.ControlDevices, want) {
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
		inv := discoverHost(t, node, h)
		if want := []allocator.ControlDevice{ctl}; !slices.Equal(inv.ControlDevices, want) {
			t.Fatalf("control devices = %+v, want %+v", inv.ControlDevices, want)
		}
		if len(inv.Warnings) != 1 || !strings.Contains(inv.Warnings[0], "stale") {
			t.Fatalf("warnings = %q, want one about the stale node", inv.Warnings)
		}
	})
}

// TestControlDevicesNotNodes needs no root: a regular file where a control
// node should be is reported, not taken.
func TestControlDevicesNotNodes(t *testing.T) {
	devRoot := t.TempDir()
	if err := os.WriteFile(filepath.Join(devRoot, allocator.NVIDIACtl), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	inv, err := allocator.Discover(context.Background(),
		allocator.WithNVML(newNode(t, "pcie8").NVML()),
		allocator.WithDevRoot(devRoot),
		allocator.WithProcRoot(fixture(t, "hosts/no-driver/proc")))
	if err != nil {
		t.Fatal(err)
	}
	if len(inv.ControlDevices) != 0 || len(inv.Warnings) != 1 || !strings.Contains(inv.Warnings[0], allocator.NVIDIACtl) {
		t.Fatalf("control devices %+v, warnings %q: want none and one warning", inv.ControlDevices, inv.Warnings)
	}
}

// TestSimulatedNodesOpenENXIO opens each simulated GPU node as root, with no
// device cgroup in the way: the open reaches the kernel, which has no NVIDIA
// driver behind major 195, and says ENXIO.
func TestSimulatedNodesOpenENXIO(t *testing.T) {
	testenv.RequireRoot(t)
	node := newNode(t, "rtx8000x4")
	h, err := node.MakeHost(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for i := range node.Len() {
		p := filepath.Join(h.DevRoot, fmt.Sprintf("nvidia%d", node.Minor(i)))
		num, err := linux.StatDevice(p)
		if err != nil || num != (linux.DeviceNumber{Char: true, Major: 195, Minor: uint32(node.Minor(i))}) {
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
