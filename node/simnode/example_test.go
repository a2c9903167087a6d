package simnode_test

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuiso/gpuiso/node/simnode"
)

// A simulated sim answers NVML calls and lets a test inject what hardware
// does: here an XID error that a health monitor would see.
func ExampleNode_InjectXID() {
	sim, err := simnode.New("hgx-h100")
	if err != nil {
		fmt.Println(err)
		return
	}
	lib := sim.NVML()
	set, _ := lib.EventSetCreate()
	gpu, _ := lib.DeviceGetHandleByIndex(4)
	gpu.RegisterEvents(nvml.EventTypeXidCriticalError, set)

	sim.InjectXID(4, 48) // double-bit ECC error
	e, ret := set.Wait(1000)
	uuid, _ := e.Device.GetUUID()
	fmt.Println(ret == nvml.SUCCESS, e.EventData, uuid == sim.UUID(4))
	// Output: true 48 true
}
