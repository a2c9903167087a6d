package docker_test

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/moby/moby/client"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/containerizer/docker"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/volume"
)

// An agent's Docker path: discover the node, recover what a previous run
// left, and run an nvidia-docker image on 2 GPUs with the driver volume.
// Needs root and a Docker daemon.
func Example() {
	ctx := context.Background()
	inv, err := nvmlnode.Discover(ctx)
	if err != nil {
		fmt.Println(err) // nvmlnode.ErrDriverNotLoaded, ErrLibraryNotFound, ...
		return
	}
	alloc, err := allocator.New(inv, allocator.WithStateDir("/var/lib/gpuiso/allocator"))
	if err != nil {
		fmt.Println(err)
		return
	}
	vols, _ := volume.New()
	cli, err := client.New(client.FromEnv)
	if err != nil {
		fmt.Println(err)
		return
	}
	z, err := docker.New(cli, alloc, docker.WithVolumes(vols))
	if err != nil {
		fmt.Println(err)
		return
	}
	if _, err := z.Recover(ctx); errors.Is(err, docker.ErrDaemonUnavailable) {
		fmt.Println("docker is down; recover again once it is back")
		return
	}
	ct, err := z.Launch(ctx, containerizer.Spec{ID: "train-7", Image: "nvidia/cuda:12.2.0-base-ubuntu22.04",
		Command: []string{"nvidia-smi", "-L"}, GPUs: allocator.Request{Count: 2}, Stdout: os.Stdout, Stderr: os.Stderr})
	if err != nil {
		fmt.Println(err) // volume.ErrRequirementUnmet, node.ErrInsufficient, ...
		return
	}
	defer z.Destroy(ctx, ct.ID)
	st, _ := z.Wait(ctx, ct.ID)
	fmt.Println("exit", st.Code)
}
