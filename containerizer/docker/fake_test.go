package docker_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	cerrdefs "github.com/containerd/errdefs"
	dockerspec "github.com/moby/docker-image-spec/specs-go/v1"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/image"
	"github.com/moby/moby/client"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/containerizer/docker"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
	"github.com/gpuiso/gpuiso/volume"
)

// fakeDaemon answers image inspections and refuses to create containers,
// counting the attempts: enough to prove what Launch refuses before it
// creates anything. Any other call panics (the embedded nil Client).
type fakeDaemon struct {
	docker.Client
	images map[string]*container.Config // nil config: an image without one

	mu      sync.Mutex
	creates int
}

func (f *fakeDaemon) ImageInspect(_ context.Context, ref string, _ ...client.ImageInspectOption) (client.ImageInspectResult, error) {
	cfg, ok := f.images[ref]
	if !ok {
		return client.ImageInspectResult{}, fmt.Errorf("no such image: %s: %w", ref, cerrdefs.ErrNotFound)
	}
	var res client.ImageInspectResult
	if cfg != nil {
		res.InspectResponse = image.InspectResponse{Config: &dockerspec.DockerOCIImageConfig{}}
		res.Config.Labels, res.Config.Env = cfg.Labels, cfg.Env
	}
	return res, nil
}

// ContainerList lists nothing: the fake daemon holds no container.
func (f *fakeDaemon) ContainerList(context.Context, client.ContainerListOptions) (client.ContainerListResult, error) {
	return client.ContainerListResult{}, nil
}

func (f *fakeDaemon) ContainerCreate(context.Context, client.ContainerCreateOptions) (client.ContainerCreateResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.creates++
	return client.ContainerCreateResult{}, errors.New("fake daemon creates nothing")
}

// TestLaunchRefuses: bad specs and images the driver cannot serve are
// refused with typed errors before any container is created or GPU held.
// No daemon needed.
func TestLaunchRefuses(t *testing.T) {
	sim, err := simnode.New("dgx1-volta")
	if err != nil {
		t.Fatal(err)
	}
	inv, err := nvmlnode.Discover(context.Background(), nvmlnode.WithNVML(sim.NVML()))
	if err != nil {
		t.Fatal(err)
	}
	alloc, err := allocator.New(inv)
	if err != nil {
		t.Fatal(err)
	}
	fake := &fakeDaemon{images: map[string]*container.Config{
		"plain":        nil,
		"needs-volume": {Labels: map[string]string{volume.LabelVolumesNeeded: "nvidia_driver"}},
		"visible-all":  {Env: []string{"NVIDIA_VISIBLE_DEVICES=all"}},
		"cuda-99":      {Env: []string{"NVIDIA_REQUIRE_CUDA=cuda>=99.0"}},
		"bad-require":  {Env: []string{"NVIDIA_REQUIRE_CUDA=cuda>>1"}},
		"arch-9":       {Env: []string{"NVIDIA_REQUIRE_ARCH=arch>=9.0"}},
	}}
	z, err := docker.New(fake, alloc) // no volume manager
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		spec containerizer.Spec
		want error
	}{
		{"empty id", containerizer.Spec{Image: "plain"}, containerizer.ErrInvalidSpec},
		{"id with slash", containerizer.Spec{ID: "../x", Image: "plain"}, node.ErrInvalidOwner},
		{"no image", containerizer.Spec{ID: "a"}, containerizer.ErrInvalidSpec},
		{"stdin", containerizer.Spec{ID: "a", Image: "plain", Stdin: strings.NewReader("x")}, containerizer.ErrNotSupported},
		{"unknown image", containerizer.Spec{ID: "a", Image: "missing"}, node.ErrNotFound},
		{"volume without manager", containerizer.Spec{ID: "a", Image: "needs-volume", GPUs: allocator.Request{Count: 1}}, docker.ErrNoVolume},
		{"visible devices without manager", containerizer.Spec{ID: "a", Image: "visible-all", GPUs: allocator.Request{Count: 1}}, docker.ErrNoVolume},
		{"cuda unmet", containerizer.Spec{ID: "a", Image: "cuda-99", GPUs: allocator.Request{Count: 1}}, volume.ErrRequirementUnmet},
		{"arch unmet", containerizer.Spec{ID: "a", Image: "arch-9", GPUs: allocator.Request{Count: 1}}, volume.ErrRequirementUnmet},
		{"requirement does not parse", containerizer.Spec{ID: "a", Image: "bad-require"}, volume.ErrInvalidRequirement},
		{"more gpus than the sim has", containerizer.Spec{ID: "a", Image: "plain", GPUs: allocator.Request{Count: 9}}, allocator.ErrInvalidRequest},
		{"unknown gpu", containerizer.Spec{ID: "a", Image: "plain", GPUs: allocator.Request{Devices: []string{"GPU-nope"}}}, allocator.ErrUnknownDevice},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := z.Launch(context.Background(), tt.spec)
			if err == nil || (tt.want != nil && !errors.Is(err, tt.want)) {
				t.Fatalf("Launch = %v, want %v", err, tt.want)
			}
			if fake.creates != 0 || len(alloc.Allocations()) != 0 || len(z.Containers()) != 0 {
				t.Fatalf("after a refused launch: %d creates, allocations %+v, containers %+v", fake.creates, alloc.Allocations(), z.Containers())
			}
		})
	}

	// A failed create leaves nothing either, and the id can be used again.
	for range 2 {
		if _, err := z.Launch(context.Background(), containerizer.Spec{ID: "a", Image: "plain", GPUs: allocator.Request{Count: 2}}); err == nil {
			t.Fatal("Launch succeeded on a daemon that creates nothing")
		}
	}
	if fake.creates != 2 || len(alloc.Allocations()) != 0 || len(z.Containers()) != 0 {
		t.Fatalf("after failed creates: %d creates, allocations %+v, containers %+v", fake.creates, alloc.Allocations(), z.Containers())
	}
	if err := z.Destroy(context.Background(), "a"); err != nil {
		t.Fatalf("Destroy of an unknown container = %v", err)
	}
	if _, err := z.Wait(context.Background(), "a"); !errors.Is(err, containerizer.ErrUnknownContainer) {
		t.Fatalf("Wait of an unknown container = %v", err)
	}
}

func TestNewRejects(t *testing.T) {
	sim, _ := simnode.New("pcie8")
	inv, err := nvmlnode.Discover(context.Background(), nvmlnode.WithNVML(sim.NVML()))
	if err != nil {
		t.Fatal(err)
	}
	alloc, _ := allocator.New(inv)
	fake := &fakeDaemon{}
	tests := []struct {
		name string
		opt  docker.Option
	}{
		{"namespace with slash", docker.WithNamespace("a/b")},
		{"empty namespace", docker.WithNamespace("")},
		{"negative stop timeout", docker.WithStopTimeout(-1)},
		{"nil logger", docker.WithLogger(nil)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if z, err := docker.New(fake, alloc, tt.opt); err == nil || z != nil {
				t.Fatalf("New = %v, %v; want an error", z, err)
			}
		})
	}
	if _, err := docker.New(nil, alloc); err == nil {
		t.Fatal("New without a client succeeded")
	}
}
