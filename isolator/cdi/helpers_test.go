package cdi_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"

	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
)

var (
	invMu    sync.Mutex
	invCache = map[string]*node.Inventory{}
)

// simInv is the shipped simulated node name as discovery reads it, with
// device nodes where a real node has them (/dev, NVIDIA's major 195,
// nvidia-uvm on 508): the same inventory, and so the same spec, in every
// run and on every host.
func simInv(tb testing.TB, name string) *node.Inventory {
	tb.Helper()
	invMu.Lock()
	defer invMu.Unlock()
	if inv, ok := invCache[name]; ok {
		return inv.Clone()
	}
	sim, err := simnode.New(name, simnode.WithDriverVersion("535.104.05"))
	if err != nil {
		tb.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "gpuiso-cdi-")
	if err != nil {
		tb.Fatal(err)
	}
	defer os.RemoveAll(dir)
	inv, err := nvmlnode.Discover(context.Background(), nvmlnode.WithNVML(sim.NVML()),
		nvmlnode.WithDevRoot(dir), nvmlnode.WithProcRoot(dir), nvmlnode.WithSysRoot(dir))
	if err != nil {
		tb.Fatal(err)
	}
	for i, d := range inv.Devices {
		inv.Devices[i].Node = node.DeviceNode{Path: fmt.Sprintf("/dev/nvidia%d", d.Minor), Major: 195, Minor: uint32(d.Minor)}
	}
	inv.ControlDevices = []node.ControlDevice{
		{Name: node.NVIDIACtl, Path: "/dev/nvidiactl", Major: 195, Minor: 255},
		{Name: node.NVIDIAUVM, Path: "/dev/nvidia-uvm", Major: 508, Minor: 0},
		{Name: node.NVIDIAUVMTools, Path: "/dev/nvidia-uvm-tools", Major: 508, Minor: 1},
		{Name: node.NVIDIAModeset, Path: "/dev/nvidia-modeset", Major: 195, Minor: 254},
	}
	invCache[name] = inv
	return inv.Clone()
}
