package isolator_test

import (
	"fmt"

	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/node"
)

// A plan says, as plain data, what a container with GPUs 1 and 3 must get;
// the back ends only apply it.
func ExampleNewPlan() {
	inv := &node.Inventory{
		Devices: []node.Device{
			{Index: 1, Minor: 1, Node: node.DeviceNode{Path: "/dev/nvidia1", Major: 195, Minor: 1}, UUID: "GPU-aaaaaaaa-0000-0000-0000-000000000001"},
			{Index: 3, Minor: 3, Node: node.DeviceNode{Path: "/dev/nvidia3", Major: 195, Minor: 3}, UUID: "GPU-aaaaaaaa-0000-0000-0000-000000000003"},
		},
		ControlDevices: []node.ControlDevice{{Name: "nvidiactl", Path: "/dev/nvidiactl", Major: 195, Minor: 255}},
	}
	gpus := []node.DeviceRef{inv.Devices[0].Ref(), inv.Devices[1].Ref()}
	plan, err := isolator.NewPlan("task-1", inv, gpus, nil, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, d := range plan.Devices {
		fmt.Println(d.Path, d.Major, d.Minor)
	}
	fmt.Println(plan.Rules[len(plan.Rules)-3:])
	fmt.Println(plan.Env[0])
	// Output:
	// /dev/nvidiactl 195 255
	// /dev/nvidia1 195 1
	// /dev/nvidia3 195 3
	// [c 195:1 rwm c 195:3 rwm c 195:255 rwm]
	// NVIDIA_VISIBLE_DEVICES=GPU-aaaaaaaa-0000-0000-0000-000000000001,GPU-aaaaaaaa-0000-0000-0000-000000000003
}
