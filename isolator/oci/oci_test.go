package oci_test

import (
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/isolator/oci"
	"github.com/gpuiso/gpuiso/node"
)

var update = flag.Bool("update", false, "rewrite testdata/*.json")

// node is a DGX-1-like inventory: two GPUs' worth of what discovery finds.
func plan(t *testing.T) *isolator.Plan {
	t.Helper()
	inv := &node.Inventory{
		Devices: []node.Device{
			{Index: 1, Minor: 1, Node: node.DeviceNode{Path: "/dev/nvidia1", Major: 195, Minor: 1}, UUID: "GPU-11111111-1111-1111-1111-111111111111", Health: node.Healthy()},
			{Index: 3, Minor: 3, Node: node.DeviceNode{Path: "/dev/nvidia3", Major: 195, Minor: 3}, UUID: "GPU-33333333-3333-3333-3333-333333333333", Health: node.Healthy()},
		},
		ControlDevices: []node.ControlDevice{
			{Name: "nvidiactl", Path: "/dev/nvidiactl", Major: 195, Minor: 255},
			{Name: "nvidia-uvm", Path: "/dev/nvidia-uvm", Major: 510, Minor: 0},
			{Name: "nvidia-uvm-tools", Path: "/dev/nvidia-uvm-tools", Major: 510, Minor: 1},
		},
	}
	vol := specs.Mount{Destination: "/usr/local/nvidia", Type: "bind", Source: "/var/run/gpuiso/volumes/nvidia_535.104.05", Options: []string{"rbind", "ro", "nosuid", "nodev"}}
	gpus := []node.DeviceRef{{Index: 1, Minor: 1, Node: node.DeviceNode{Path: "/dev/nvidia1", Major: 195, Minor: 1}, UUID: inv.Devices[0].UUID}, {Index: 3, Minor: 3, Node: node.DeviceNode{Path: "/dev/nvidia3", Major: 195, Minor: 3}, UUID: inv.Devices[1].UUID}}
	p, err := isolator.NewPlan("task-1", inv, gpus, []specs.Mount{vol},
		[]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/usr/local/nvidia/bin", "LD_LIBRARY_PATH=/usr/local/cuda/compat:/usr/local/nvidia/lib:/usr/local/nvidia/lib64"})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func baseSpec() *specs.Spec {
	return &specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{Args: []string{"nvidia-smi"}, Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "TERM=xterm"}},
		Root:    &specs.Root{Path: "rootfs"},
		Mounts:  []specs.Mount{{Destination: "/proc", Type: "proc", Source: "proc"}},
		Linux: &specs.Linux{Resources: &specs.LinuxResources{Devices: []specs.LinuxDeviceCgroup{
			{Allow: false, Access: "rwm"},
		}}},
	}
}

func TestApply(t *testing.T) {
	spec := baseSpec()
	if err := oci.Apply(spec, plan(t)); err != nil {
		t.Fatal(err)
	}
	got, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "gpus-1-3.json")
	if *update {
		os.WriteFile(golden, append(got, '\n'), 0o644)
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if string(got)+"\n" != string(want) {
		t.Fatalf("spec differs from %s (go test -update rewrites it):\n%s", golden, got)
	}

	again := baseSpec()
	oci.Apply(again, plan(t))
	oci.Apply(again, plan(t))
	if !reflect.DeepEqual(again, spec) {
		t.Fatal("applying a plan twice differs from applying it once")
	}
}

func TestApplyRejects(t *testing.T) {
	spec := baseSpec()
	spec.Linux = nil
	if err := oci.Apply(spec, plan(t)); !errors.Is(err, oci.ErrNoLinux) {
		t.Fatalf("Apply without a linux section = %v", err)
	}
	if spec.Linux != nil || len(spec.Mounts) != 1 {
		t.Fatal("a refused Apply changed the spec")
	}
}
