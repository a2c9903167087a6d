package cdi_test

import (
	"context"
	"fmt"
	"os"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/isolator/cdi"
	"github.com/gpuiso/gpuiso/node"
)

// The spec of a node with one GPU, written twice: the second write leaves
// the file alone.
func ExampleWriter_Write() {
	inv := &node.Inventory{
		Devices: []node.Device{{
			Index: 0, Minor: 0, UUID: "GPU-0f0e0d0c-0b0a-0908-0706-050403020100",
			Node:   node.DeviceNode{Path: "/dev/nvidia0", Major: 195, Minor: 0},
			Health: node.Healthy(),
		}},
		ControlDevices: []node.ControlDevice{{Name: node.NVIDIACtl, Path: "/dev/nvidiactl", Major: 195, Minor: 255}},
	}
	spec, err := cdi.New(inv)
	if err != nil {
		fmt.Println(err)
		return
	}
	dir, _ := os.MkdirTemp("", "cdi-example-")
	defer os.RemoveAll(dir)
	w := cdi.Writer{Dir: dir}
	for range 2 {
		res, err := w.Write(context.Background(), spec)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println("changed:", res.Changed)
	}
	for _, d := range spec.Devices {
		fmt.Printf("%s=%s\n", spec.Kind, d.Name)
	}
	// Output:
	// changed: true
	// changed: false
	// nvidia.com/gpu=0
	// nvidia.com/gpu=GPU-0f0e0d0c-0b0a-0908-0706-050403020100
	// nvidia.com/gpu=all
}

// An allocation of two GPUs rendered as its own CDI device and written
// beside the node's spec: the name a runtime is given (from the write),
// and what the device sets. AllocationNames gives the names of the same
// GPUs in the node's spec.
func ExampleRender() {
	inv := &node.Inventory{
		Devices: []node.Device{
			{Index: 0, Minor: 0, UUID: "GPU-00000000-0000-0000-0000-000000000000", Node: node.DeviceNode{Path: "/dev/nvidia0", Major: 195, Minor: 0}, Health: node.Healthy()},
			{Index: 1, Minor: 1, UUID: "GPU-11111111-1111-1111-1111-111111111111", Node: node.DeviceNode{Path: "/dev/nvidia1", Major: 195, Minor: 1}, Health: node.Healthy()},
		},
		ControlDevices: []node.ControlDevice{{Name: node.NVIDIACtl, Path: "/dev/nvidiactl", Major: 195, Minor: 255}},
	}
	al := allocator.Allocation{Owner: "task-1", Devices: []node.DeviceRef{inv.Devices[0].Ref(), inv.Devices[1].Ref()}}
	plan, err := isolator.NewPlan(al.Owner, inv, al.Devices, nil, []string{"PATH=/opt/tool/bin:/usr/bin:/usr/local/nvidia/bin"})
	if err != nil {
		fmt.Println(err)
		return
	}
	spec, err := cdi.Render(cdi.DefaultKind, plan)
	if err != nil {
		fmt.Println(err)
		return
	}
	dir, _ := os.MkdirTemp("", "cdi-example-")
	defer os.RemoveAll(dir)
	res, err := cdi.Writer{Dir: dir}.WriteAllocation(context.Background(), al.Owner, spec)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(res.Names)
	names, _ := cdi.AllocationNames(cdi.DefaultKind, al)
	fmt.Println(names)
	for _, n := range spec.Devices[0].ContainerEdits.DeviceNodes {
		fmt.Println(n.Path)
	}
	for _, e := range spec.Devices[0].ContainerEdits.Env {
		fmt.Println(e)
	}
	// Output:
	// [nvidia.com/gpu=alloc-task-1]
	// [nvidia.com/gpu=GPU-00000000-0000-0000-0000-000000000000 nvidia.com/gpu=GPU-11111111-1111-1111-1111-111111111111]
	// /dev/nvidiactl
	// /dev/nvidia0
	// /dev/nvidia1
	// NVIDIA_VISIBLE_DEVICES=GPU-00000000-0000-0000-0000-000000000000,GPU-11111111-1111-1111-1111-111111111111
	// CUDA_VISIBLE_DEVICES=GPU-00000000-0000-0000-0000-000000000000,GPU-11111111-1111-1111-1111-111111111111
}
