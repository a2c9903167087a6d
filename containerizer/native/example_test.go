package native_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/containerizer/native"
	"github.com/gpuiso/gpuiso/isolator/cgroups"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/volume"
)

// An agent's whole GPU path: discover, allocate, isolate, run. The program's
// main must call native.Init first, because each container's init is this
// binary started again. Needs root.
func ExampleContainerizer_Launch() {
	native.Init()
	ctx := context.Background()
	inv, err := nvmlnode.Discover(ctx)
	if err != nil {
		fmt.Println(err) // nvmlnode.ErrDriverNotLoaded, ErrLibraryNotFound, ...
		return
	}
	a, _ := allocator.New(inv, allocator.WithStateDir("/var/lib/gpuiso/allocator"))
	iso, _ := cgroups.New() // New moves it to the state directory's own cgroup parent
	vols, _ := volume.New()
	c, err := native.New(native.Config{Allocator: a, Inventory: inv, Isolator: iso, Volumes: vols,
		StateDir: "/run/gpuiso/agent-7"})
	if err != nil {
		fmt.Println(err)
		return
	}
	// Only this state directory's containers and cgroups are recovered or
	// cleaned: other agents' are never touched, nor waited for.
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	c.Recover(rctx)
	cancel()
	ct, err := c.Launch(ctx, containerizer.Spec{ID: "train-7", Command: []string{"nvidia-smi", "-L"},
		GPUs: allocator.Request{Count: 2}, Stdout: os.Stdout, Stderr: os.Stderr})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Destroy(ctx, ct.ID)
	st, _ := c.Wait(ctx, ct.ID)
	fmt.Println("exit", st.Code)
}
