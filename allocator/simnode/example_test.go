package simnode_test

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuiso/gpuiso/allocator/simnode"
)

// A simulated node answers NVML calls and lets a test inject what hardware
// does: here an XID error that a health monitor would see.
func ExampleNode_InjectXID() {
	node, err := simnode.New("hgx-h100")
	if err != nil {
		fmt.Println(err)
		return
	}
	lib := node.NVML()
	set, _ := lib.EventSetCreate()
	gpu, _ := lib.DeviceGetHandleByIndex(4)
	gpu.RegisterEvents(nvml.EventTypeXidCriticalError, set)

	node.InjectXID(4, 48) // double-bit ECC error
	e, ret := set.Wait(1000)
	uuid, _ := e.Device.GetUUID()
	fmt.Println(ret == nvml.SUCCESS, e.EventData, uuid == node.UUID(4))
	// Output: true 48 true
}
