package chain_test

import (
	"context"
	"fmt"
	"os/exec"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/containerizer/chain"
	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
)

// An agent with its own runtime adds GPUs to its isolation chain: recover
// once at start with the containers it still knows, then for each
// container prepare, isolate its first process, and clean up after it.
// (Runs as root on a node with the NVIDIA driver; a real agent isolates
// the process before it executes the command, see examples/agent.)
func Example() {
	ctx := context.Background()
	inv, err := nvmlnode.Discover(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	alloc, err := allocator.New(inv, allocator.WithStateDir("/var/lib/myagent/alloc"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer alloc.Close()
	gpu, err := chain.New(chain.Config{Allocator: alloc, Inventory: inv, StateDir: "/var/lib/myagent/gpu"})
	if err != nil {
		fmt.Println(err)
		return
	}
	if _, err := gpu.Recover(ctx, nil); err != nil { // the agent's running containers
		fmt.Println(err)
		return
	}

	launch, err := gpu.Prepare(ctx, "task-1", allocator.Request{Count: 2}, containerizer.Image{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer gpu.Cleanup(ctx, "task-1")
	cmd := exec.Command("nvidia-smi", "-L")
	cmd.Env = isolator.MergeEnv(cmd.Environ(), launch.Plan.Env)
	if err := cmd.Start(); err != nil {
		fmt.Println(err)
		return
	}
	if err := gpu.Isolate(ctx, "task-1", cmd.Process.Pid); err != nil {
		fmt.Println(err)
	}
	cmd.Wait()
}
