package dockerconfig_test

import (
	"fmt"

	"github.com/moby/moby/api/types/container"

	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/isolator/dockerconfig"
	"github.com/gpuiso/gpuiso/node"
)

// A container given GPU 3 gets its node and the control devices, mapped
// with "rwm", and the variables naming its GPU.
func Example() {
	inv := &node.Inventory{
		Devices:        []node.Device{{Index: 3, Minor: 3, Node: node.DeviceNode{Path: "/dev/nvidia3", Major: 195, Minor: 3}, UUID: "GPU-33333333-3333-3333-3333-333333333333"}},
		ControlDevices: []node.ControlDevice{{Name: "nvidiactl", Path: "/dev/nvidiactl", Major: 195, Minor: 255}},
	}
	plan, err := isolator.NewPlan("task-1", inv, []node.DeviceRef{{Index: 3, Minor: 3, Node: node.DeviceNode{Path: "/dev/nvidia3", Major: 195, Minor: 3}, UUID: inv.Devices[0].UUID}}, nil, nil)
	if err != nil {
		panic(err)
	}
	c, err := dockerconfig.New(plan)
	if err != nil {
		panic(err)
	}
	cfg := &container.Config{Image: "nvidia/cuda:12.2.0-base"}
	hc := &container.HostConfig{}
	if err := c.Apply(cfg, hc); err != nil {
		panic(err)
	}
	for _, d := range hc.Devices {
		fmt.Println(d.PathOnHost, "->", d.PathInContainer, d.CgroupPermissions)
	}
	fmt.Println(cfg.Env[0])
	fmt.Println(cfg.Labels[dockerconfig.LabelOwner])
	// Output:
	// /dev/nvidiactl -> /dev/nvidiactl rwm
	// /dev/nvidia3 -> /dev/nvidia3 rwm
	// NVIDIA_VISIBLE_DEVICES=GPU-33333333-3333-3333-3333-333333333333
	// task-1
}
