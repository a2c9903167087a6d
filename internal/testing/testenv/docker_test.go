package testenv

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
)

// TestHostDockerScratchImage proves that the host's daemon builds and runs an
// image FROM scratch without any registry: the way every Docker test of the
// project gets its images.
func TestHostDockerScratchImage(t *testing.T) {
	cli := RequireDocker(t)
	LockDocker(t, false)
	tag := BuildProbeImage(t, cli, ProbeImage{
		Labels: map[string]string{"com.nvidia.volumes.needed": "nvidia_driver"},
		Env:    map[string]string{"NVIDIA_VISIBLE_DEVICES": "all"},
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	insp, err := cli.ImageInspect(ctx, tag)
	if err != nil {
		t.Fatal(err)
	}
	if insp.Config == nil || insp.Config.Labels["com.nvidia.volumes.needed"] != "nvidia_driver" ||
		!slices.Contains(insp.Config.Env, "NVIDIA_VISIBLE_DEVICES=all") {
		t.Fatalf("image config = %+v, want the label and the variable", insp.Config)
	}

	created, err := cli.ContainerCreate(ctx, client.ContainerCreateOptions{
		Config: &container.Config{Image: tag, Cmd: []string{"exit", "7"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.ContainerRemove(context.Background(), created.ID, client.ContainerRemoveOptions{Force: true})
	wait := cli.ContainerWait(ctx, created.ID, client.ContainerWaitOptions{Condition: container.WaitConditionNextExit})
	if _, err := cli.ContainerStart(ctx, created.ID, client.ContainerStartOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case res := <-wait.Result:
		if res.StatusCode != 7 {
			t.Fatalf("probe exited %d, want 7 (error %v)", res.StatusCode, res.Error)
		}
	case err := <-wait.Error:
		t.Fatal(err)
	}
}
