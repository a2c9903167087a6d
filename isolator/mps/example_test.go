package mps_test

import (
	"context"
	"fmt"

	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/isolator/mps"
	"github.com/gpuiso/gpuiso/node"
)

// A memory share's daemon: started for the share's GPU with its limits,
// handed to the container's plan, stopped with the share.
func Example() {
	ctx := context.Background()
	m, err := mps.New("/var/lib/gpuiso/example/mps")
	if err != nil {
		fmt.Println(err) // no nvidia-cuda-mps-control on this node: ErrNoControl
		return
	}
	defer m.Close()
	gpu := node.DeviceRef{Index: 0, UUID: "GPU-5d1a1c8e-0000-0000-0000-000000000000"}
	d, err := m.Start(ctx, "job-1", gpu, mps.Limits{MemoryBytes: 4 << 30, ComputePercent: 50})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer m.Stop(ctx, "job-1")
	// What the container gets: the pipe directory at /tmp/nvidia-mps, the
	// daemon's /dev/shm and the share's client limits (isolator.WithShare
	// to NewPlan).
	_ = isolator.WithShare(&d)
	fmt.Println("daemon", d.Pid, "serves", d.GPU)
}
