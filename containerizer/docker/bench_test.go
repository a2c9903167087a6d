package docker_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/containerizer/docker"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/isolator/dockerconfig"
	"github.com/gpuiso/gpuiso/node"
)

// BenchmarkLaunch times create+start+wait+remove of a trivial container
// with 1 GPU of a simulated node, through the containerizer (image
// inspection, requirement check, allocation, plan, labels, release) and
// through the same bare calls on the moby client with the same container
// configuration, in one run.
func BenchmarkLaunch(b *testing.B) {
	testenv.RequireRoot(b)
	cli := testenv.RequireDocker(b)
	testenv.LockDocker(b, false)
	_, _, inv := testenv.SimulatedNode(b, "pcie8")
	img := testenv.BuildProbeImage(b, cli, testenv.ProbeImage{})
	ns := fmt.Sprintf("bench-%d", time.Now().UnixNano())
	ctx := context.Background()
	cmd := []string{"exit", "0"}

	b.Run("impl=gpuiso", func(b *testing.B) {
		alloc, err := allocator.New(inv)
		if err != nil {
			b.Fatal(err)
		}
		z, err := docker.New(cli, alloc, docker.WithNamespace(ns))
		if err != nil {
			b.Fatal(err)
		}
		for i := 0; b.Loop(); i++ {
			id := fmt.Sprintf("bench-%d", i)
			if _, err := z.Launch(ctx, containerizer.Spec{ID: id, Image: img, Command: cmd, GPUs: allocator.Request{Count: 1}}); err != nil {
				b.Fatal(err)
			}
			if st, err := z.Wait(ctx, id); err != nil || st.Code != 0 {
				b.Fatalf("wait: %+v, %v", st, err)
			}
			if err := z.Destroy(ctx, id); err != nil {
				b.Fatal(err)
			}
		}
	})

	b.Run("impl=moby", func(b *testing.B) {
		// The configuration the containerizer creates for GPU 0.
		gpu := inv.Devices[0]
		plan, err := isolator.NewPlan("bench", inv, []node.DeviceRef{gpu.Ref()}, nil, nil)
		if err != nil {
			b.Fatal(err)
		}
		dcfg, err := dockerconfig.New(plan)
		if err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			cfg := &container.Config{Image: img, Cmd: cmd, Labels: map[string]string{docker.LabelNamespace: ns}}
			hc := &container.HostConfig{}
			dcfg.Apply(cfg, hc)
			created, err := cli.ContainerCreate(ctx, client.ContainerCreateOptions{Config: cfg, HostConfig: hc})
			if err != nil {
				b.Fatal(err)
			}
			if _, err := cli.ContainerStart(ctx, created.ID, client.ContainerStartOptions{}); err != nil {
				b.Fatal(err)
			}
			res := cli.ContainerWait(ctx, created.ID, client.ContainerWaitOptions{Condition: container.WaitConditionNotRunning})
			select {
			case r := <-res.Result:
				if r.StatusCode != 0 {
					b.Fatalf("exit %d", r.StatusCode)
				}
			case err := <-res.Error:
				b.Fatal(err)
			}
			if _, err := cli.ContainerRemove(ctx, created.ID, client.ContainerRemoveOptions{Force: true}); err != nil {
				b.Fatal(err)
			}
		}
	})
}
