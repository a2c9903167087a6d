package containerizer_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/volume"
)

func TestWantsVolume(t *testing.T) {
	labelled := map[string]string{"com.nvidia.volumes.needed": "nvidia_driver"}
	for _, tc := range []struct {
		name string
		img  containerizer.Image
		env  []string
		want bool
	}{
		{"host file system", containerizer.Image{Labels: labelled}, []string{"NVIDIA_VISIBLE_DEVICES=all"}, false},
		{"own root, no request", containerizer.Image{OwnRoot: true}, nil, false},
		{"own root, visible devices", containerizer.Image{OwnRoot: true}, []string{"NVIDIA_VISIBLE_DEVICES=all"}, true},
		{"own root, image visible devices", containerizer.Image{OwnRoot: true, Env: []string{"NVIDIA_VISIBLE_DEVICES=all"}}, nil, true},
		{"own root, spec voids it", containerizer.Image{OwnRoot: true, Env: []string{"NVIDIA_VISIBLE_DEVICES=all"}}, []string{"NVIDIA_VISIBLE_DEVICES=void"}, false},
		{"own root, label", containerizer.Image{OwnRoot: true, Labels: labelled}, nil, true},
	} {
		if got := tc.img.WantsVolume(tc.env); got != tc.want {
			t.Errorf("%s: WantsVolume = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestPrepareRequirements checks that an image's requirements hold for the
// GPUs a container is given, whole or MIG, and for the driver.
func TestPrepareRequirements(t *testing.T) {
	inv, _ := simAllocator(t, "hgx-h100-mig")
	// Discovery without a host tree finds no capability nodes; give each
	// MIG device some, as a host's /dev/nvidia-caps would.
	minor := uint32(0)
	for i := range inv.Devices {
		for j := range inv.Devices[i].MIGDevices {
			m := &inv.Devices[i].MIGDevices[j]
			m.GIAccess = node.DeviceNode{Path: fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", minor), Major: 240, Minor: minor}
			m.CIAccess = node.DeviceNode{Path: fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", minor+1), Major: 240, Minor: minor + 1}
			minor += 2
		}
	}
	alloc, err := allocator.New(inv)
	if err != nil {
		t.Fatal(err)
	}
	old := inv.Clone()
	old.DriverVersion, old.CUDAVersion = "470.256.02", node.CUDAVersion(11040)
	oldAlloc, err := allocator.New(old)
	if err != nil {
		t.Fatal(err)
	}
	whole := allocator.Request{Count: 1}
	mig := allocator.Request{MIG: "1g.10gb"}
	for _, tc := range []struct {
		name  string
		alloc *allocator.Allocator
		gpus  allocator.Request
		env   string
		unmet bool
	}{
		{"whole gpu, arch met", alloc, whole, "NVIDIA_REQUIRE_ARCH=arch>=9.0", false},
		{"whole gpu, arch unmet", alloc, whole, "NVIDIA_REQUIRE_ARCH=arch>=99.0", true},
		{"mig, arch met", alloc, mig, "NVIDIA_REQUIRE_ARCH=arch>=9.0", false},
		{"mig, arch unmet", alloc, mig, "NVIDIA_REQUIRE_ARCH=arch>=99.0", true},
		{"mig, brand unmet", alloc, mig, "NVIDIA_REQUIRE_BRAND=brand=geforce", true},
		{"470 driver, unknown alternative dropped", oldAlloc, mig, "NVIDIA_REQUIRE_CUDA=cuda>=13.0 foo=bar", true},
		{"470 driver, cuda met", oldAlloc, mig, "NVIDIA_REQUIRE_CUDA=cuda>=11.0 foo=bar", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pr := &containerizer.Preparer{Allocator: tc.alloc}
			spec := containerizer.Spec{ID: "req-test", GPUs: tc.gpus}
			p, err := pr.Prepare(context.Background(), spec, containerizer.Image{Env: []string{tc.env}})
			if tc.unmet {
				if !errors.Is(err, volume.ErrRequirementUnmet) {
					t.Fatalf("Prepare = %v, want ErrRequirementUnmet", err)
				}
				if held, _ := tc.alloc.Allocation(spec.ID); len(held.Devices) != 0 {
					t.Fatalf("refused container still holds %v", held.Devices)
				}
				return
			}
			if err != nil {
				t.Fatalf("Prepare = %v", err)
			}
			if err := p.Undo(context.Background()); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestPrepareBadOwner: Prepare trusts its caller's check of the owner, and
// still a bad one takes nothing: the allocator or NewPlan refuses it.
func TestPrepareBadOwner(t *testing.T) {
	ctx := context.Background()
	_, alloc := simAllocator(t, "dgx1-volta")
	pr := &containerizer.Preparer{Allocator: alloc}
	for _, req := range []allocator.Request{{Count: 1}, {}} {
		if p, err := pr.Prepare(ctx, containerizer.Spec{ID: "../x", GPUs: req}, containerizer.Image{}); !errors.Is(err, node.ErrInvalid) || p != nil {
			t.Errorf("prepare %+v for a bad owner: %v, %v", req, p, err)
		}
		if got := alloc.Allocations(); len(got) != 0 {
			t.Fatalf("held for a bad owner: %+v", got)
		}
	}
}

// TestPreparedEnv: Prepare merges the container's environment once: the
// image's, the spec's over it, the plan's over both (the plan names the
// GPUs, whatever the image or the spec said).
func TestPreparedEnv(t *testing.T) {
	_, alloc := simAllocator(t, "dgx1-volta")
	pr := &containerizer.Preparer{Allocator: alloc}
	img := containerizer.Image{Env: []string{"PATH=/bin", "A=image", "NVIDIA_VISIBLE_DEVICES=all"}}
	spec := containerizer.Spec{ID: "env", Env: []string{"A=spec", "B=spec"}, GPUs: allocator.Request{Count: 1}}
	p, err := pr.Prepare(context.Background(), spec, img)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Undo(context.Background())
	u := p.Allocation.Devices[0].UUID
	want := []string{"PATH=/bin", "A=spec", "NVIDIA_VISIBLE_DEVICES=" + u, "B=spec", "CUDA_VISIBLE_DEVICES=" + u}
	if fmt.Sprint(p.Env) != fmt.Sprint(want) {
		t.Fatalf("env = %v, want %v", p.Env, want)
	}
}
