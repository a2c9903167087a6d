package oci_test

import (
	"fmt"

	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/isolator/oci"
	"github.com/gpuiso/gpuiso/node"
)

// An OCI spec edited for a container given GPU 3: its node and the control
// node, allowed behind a deny-all, and the variables naming the GPU.
func ExampleApply() {
	inv := &node.Inventory{
		Devices:        []node.Device{{Index: 3, Minor: 3, Node: node.DeviceNode{Path: "/dev/nvidia3", Major: 195, Minor: 3}, UUID: "GPU-33333333-3333-3333-3333-333333333333"}},
		ControlDevices: []node.ControlDevice{{Name: "nvidiactl", Path: "/dev/nvidiactl", Major: 195, Minor: 255}},
	}
	plan, err := isolator.NewPlan("task-1", inv, []node.DeviceRef{inv.Devices[0].Ref()}, nil, nil)
	if err != nil {
		panic(err)
	}
	spec := &specs.Spec{Process: &specs.Process{Env: []string{"PATH=/usr/bin:/bin"}}, Linux: &specs.Linux{}}
	if err := oci.Apply(spec, plan); err != nil {
		panic(err)
	}
	for _, d := range spec.Linux.Devices {
		fmt.Println(d.Path, d.Major, d.Minor)
	}
	rules := spec.Linux.Resources.Devices
	fmt.Println(rules[0].Allow, rules[0].Access)
	fmt.Println(spec.Process.Env)
	// Output:
	// /dev/nvidiactl 195 255
	// /dev/nvidia3 195 3
	// false rwm
	// [PATH=/usr/bin:/bin NVIDIA_VISIBLE_DEVICES=GPU-33333333-3333-3333-3333-333333333333 CUDA_VISIBLE_DEVICES=GPU-33333333-3333-3333-3333-333333333333]
}
