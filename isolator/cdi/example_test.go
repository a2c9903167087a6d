package cdi_test

import (
	"context"
	"fmt"
	"os"

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
