package isolator_test

import (
	"slices"
	"testing"

	"github.com/moby/moby/api/types/container"
	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/isolator/dockerconfig"
	"github.com/gpuiso/gpuiso/isolator/oci"
	"github.com/gpuiso/gpuiso/node"
)

// TestMIGRenderings: a MIG device's plan reaches an OCI spec and a Docker
// host config with its parent's node and its two capability nodes (device
// entries and allow rules), and nothing of its sibling instance.
func TestMIGRenderings(t *testing.T) {
	inv := migInv()
	ref := inv.Devices[0].MIGRef(inv.Devices[0].MIGDevices[1])
	plan, err := isolator.NewPlan("task-1", inv, []node.DeviceRef{ref}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	own := []string{"/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap21", "/dev/nvidia-caps/nvidia-cap22"}
	sibling := []string{"/dev/nvidia-caps/nvidia-cap12", "/dev/nvidia-caps/nvidia-cap13"}

	spec := &specs.Spec{Process: &specs.Process{}, Linux: &specs.Linux{}}
	if err := oci.Apply(spec, plan); err != nil {
		t.Fatal(err)
	}
	var ociPaths []string
	for _, d := range spec.Linux.Devices {
		ociPaths = append(ociPaths, d.Path)
	}
	var allowed []int64
	for _, r := range spec.Linux.Resources.Devices {
		if r.Allow && r.Major != nil && *r.Major == 241 && r.Minor != nil {
			allowed = append(allowed, *r.Minor)
		}
	}
	slices.Sort(allowed)

	cfg, err := dockerconfig.New(plan)
	if err != nil {
		t.Fatal(err)
	}
	var c container.Config
	var hc container.HostConfig
	if err := cfg.Apply(&c, &hc); err != nil {
		t.Fatal(err)
	}
	var dockerPaths []string
	for _, d := range hc.Devices {
		dockerPaths = append(dockerPaths, d.PathInContainer)
	}
	for _, p := range own {
		if !slices.Contains(ociPaths, p) || !slices.Contains(dockerPaths, p) {
			t.Errorf("%s missing: OCI %v, Docker %v", p, ociPaths, dockerPaths)
		}
	}
	for _, p := range sibling {
		if slices.Contains(ociPaths, p) || slices.Contains(dockerPaths, p) {
			t.Errorf("sibling's %s given: OCI %v, Docker %v", p, ociPaths, dockerPaths)
		}
	}
	if !slices.Equal(allowed, []int64{21, 22}) {
		t.Errorf("OCI allows caps minors %v, want [21 22]", allowed)
	}
}
