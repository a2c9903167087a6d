package cdi_test

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/isolator/cdi"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/volume"
)

var update = flag.Bool("update", false, "rewrite testdata/*.json")

var vol = &volume.Volume{Version: "535.104.05", Path: "/var/run/gpuiso/volumes/nvidia_535.104.05"}

// golden compares got with testdata/name, or rewrites it with -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs (run with -update to accept):\n%s", path, got)
	}
}

func TestNewGolden(t *testing.T) {
	tests := []struct {
		name string
		node string
		opts []cdi.Option
	}{
		{"dgx1-volta.json", "dgx1-volta", nil},
		{"dgx1-volta-volume.json", "dgx1-volta", []cdi.Option{cdi.WithVolume(vol)}},
		{"rtx8000x4-kind.json", "rtx8000x4", []cdi.Option{cdi.WithKind("example.com/gpu")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec, err := cdi.New(simInv(t, tt.node), tt.opts...)
			if err != nil {
				t.Fatal(err)
			}
			b, err := cdi.Encode(spec)
			if err != nil {
				t.Fatal(err)
			}
			golden(t, tt.name, b)
			// The CDI library accepts what a runtime will read.
			res, err := cdi.Writer{Dir: t.TempDir()}.Write(t.Context(), spec)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := cdi.ValidateFile(res.Path); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestNewShape(t *testing.T) {
	inv := simInv(t, "dgx1-volta")
	spec, err := cdi.New(inv, cdi.WithVolume(vol))
	if err != nil {
		t.Fatal(err)
	}
	if spec.Version != "0.5.0" {
		t.Errorf("version %s, want 0.5.0 (device names start with a digit, nodes have host paths)", spec.Version)
	}
	if got, want := len(spec.Devices), 2*len(inv.Devices)+1; got != want {
		t.Errorf("%d devices, want %d", got, want)
	}
	for _, d := range inv.Devices {
		for _, name := range []string{strconv.Itoa(d.Index), d.UUID} {
			dev := device(spec, name)
			if dev == nil {
				t.Fatalf("no device %s", name)
			}
			n := dev.ContainerEdits.DeviceNodes
			if len(n) != 1 || n[0].HostPath != d.Node.Path || n[0].Major != int64(d.Node.Major) || n[0].Minor != int64(d.Node.Minor) || n[0].Type != "c" {
				t.Errorf("device %s nodes %+v, want %v", name, n[0], d.Node)
			}
			// A GPU's device sets no variable: two of them in one
			// container would leave it one GPU's.
			if len(dev.ContainerEdits.Env) != 0 {
				t.Errorf("device %s env %v, want none", name, dev.ContainerEdits.Env)
			}
		}
	}
	var ctl []string
	for _, n := range spec.ContainerEdits.DeviceNodes {
		ctl = append(ctl, n.Path)
	}
	if !slices.Equal(ctl, []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}) {
		t.Errorf("control nodes %v", ctl)
	}
	// PATH and LD_LIBRARY_PATH are left to the image: CDI would replace
	// them.
	if len(spec.ContainerEdits.Env) != 0 {
		t.Errorf("spec env %v, want none", spec.ContainerEdits.Env)
	}
	m := spec.ContainerEdits.Mounts
	if len(m) != 1 || m[0].ContainerPath != volume.ContainerPath || !slices.Contains(m[0].Options, "ro") || !slices.Contains(m[0].Options, "nosuid") || !slices.Contains(m[0].Options, "nodev") {
		t.Errorf("mounts %+v", m)
	}
}

func TestNewLeavesOutUnhealthy(t *testing.T) {
	inv := simInv(t, "dgx1-volta")
	gone := inv.Devices[3]
	inv.Devices[3].Health = node.Unhealthy("XID 79")
	inv.Devices[5].Node = node.DeviceNode{} // minor unknown: no node to give
	spec, err := cdi.New(inv)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"3", gone.UUID, "5", inv.Devices[5].UUID} {
		if device(spec, name) != nil {
			t.Errorf("device %s in the spec", name)
		}
	}
	all := device(spec, cdi.AllDevices)
	if len(all.ContainerEdits.DeviceNodes) != len(inv.Devices)-2 || strings.Contains(all.ContainerEdits.Env[0], gone.UUID) {
		t.Errorf("all: %d nodes, env %v", len(all.ContainerEdits.DeviceNodes), all.ContainerEdits.Env)
	}
}

func TestNewRejects(t *testing.T) {
	inv := simInv(t, "dgx1-volta")
	sick := inv.Clone()
	for i := range sick.Devices {
		sick.Devices[i].Health = node.Unhealthy("lost")
	}
	tests := []struct {
		name string
		inv  *node.Inventory
		opts []cdi.Option
		want error
	}{
		{"no slash", inv, []cdi.Option{cdi.WithKind("nvidia.com")}, cdi.ErrInvalidKind},
		{"bad vendor", inv, []cdi.Option{cdi.WithKind("-nvidia.com/gpu")}, cdi.ErrInvalidKind},
		{"bad class", inv, []cdi.Option{cdi.WithKind("nvidia.com/g pu")}, cdi.ErrInvalidKind},
		{"empty kind", inv, []cdi.Option{cdi.WithKind("")}, node.ErrInvalid},
		{"relative volume", inv, []cdi.Option{cdi.WithVolume(&volume.Volume{Path: "vol"})}, node.ErrInvalid},
		{"nil inventory", nil, nil, cdi.ErrNoDevices},
		{"no healthy GPU", sick, nil, node.ErrNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec, err := cdi.New(tt.inv, tt.opts...)
			if !errors.Is(err, tt.want) || spec != nil {
				t.Fatalf("New = %v, %v; want %v", spec, err, tt.want)
			}
		})
	}
}

func TestNames(t *testing.T) {
	inv := simInv(t, "dgx1-volta")
	gpus := []node.DeviceRef{inv.Devices[0].Ref(), inv.Devices[3].Ref()}
	al := allocator.Allocation{Owner: "task-1", Devices: gpus}
	got, err := cdi.AllocationNames(cdi.DefaultKind, al)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"nvidia.com/gpu=" + gpus[0].UUID, "nvidia.com/gpu=" + gpus[1].UUID}; !slices.Equal(got, want) {
		t.Errorf("names %v, want %v", got, want)
	}
	if n, err := cdi.AllocationNames(cdi.DefaultKind, allocator.Allocation{Owner: "task-2"}); err != nil || len(n) != 0 {
		t.Errorf("no GPU: %v, %v; want no names", n, err)
	}
	if _, err := cdi.AllocationNames("nvidia", al); !errors.Is(err, cdi.ErrInvalidKind) {
		t.Errorf("bad kind: %v", err)
	}
	noUUID := gpus[0]
	noUUID.UUID = ""
	if _, err := cdi.AllocationNames(cdi.DefaultKind, allocator.Allocation{Owner: "task-3", Devices: []node.DeviceRef{noUUID}}); !errors.Is(err, cdi.ErrUnresolvable) || !errors.Is(err, node.ErrNotFound) {
		t.Errorf("a GPU without UUID: %v, want ErrUnresolvable", err)
	}
	if n, err := cdi.Names(cdi.DefaultKind, gpus); err != nil || !slices.Equal(n, []string{"nvidia.com/gpu=" + gpus[0].UUID, "nvidia.com/gpu=" + gpus[1].UUID}) {
		t.Errorf("GPU names %v, %v", n, err)
	}
	// The allocation's own device is the one device of its plan's spec,
	// which holds every node of the plan and names every GPU.
	plan, err := isolator.NewPlan(al.Owner, inv, gpus, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	spec, err := cdi.Render(cdi.DefaultKind, plan)
	if err != nil {
		t.Fatal(err)
	}
	dev := device(spec, cdi.AllocationDevice(al.Owner))
	if dev == nil || len(spec.Devices) != 1 {
		t.Fatalf("%s: not the device of the plan's spec %+v", cdi.AllocationDevice(al.Owner), spec.Devices)
	}
	if len(dev.ContainerEdits.DeviceNodes) != len(plan.Devices) {
		t.Errorf("allocation device nodes %d, want the plan's %d", len(dev.ContainerEdits.DeviceNodes), len(plan.Devices))
	}
	visible := gpus[0].UUID + "," + gpus[1].UUID
	if !slices.Contains(dev.ContainerEdits.Env, "NVIDIA_VISIBLE_DEVICES="+visible) || !slices.Contains(dev.ContainerEdits.Env, "CUDA_VISIBLE_DEVICES="+visible) {
		t.Errorf("allocation env %v, want both GPUs named", dev.ContainerEdits.Env)
	}
}

func device(spec *specs.Spec, name string) *specs.Device {
	for i := range spec.Devices {
		if spec.Devices[i].Name == name {
			return &spec.Devices[i]
		}
	}
	return nil
}

// TestNewMIG: a GPU split into MIG devices is listed by instance, never
// whole; each instance gets its parent's node and its own two caps nodes,
// nothing of its siblings, and its MIG UUID.
func TestNewMIG(t *testing.T) {
	caps := func(m uint32) node.DeviceNode {
		return node.DeviceNode{Path: fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", m), Major: 241, Minor: m}
	}
	mig := func(gi, ci int, giCap, ciCap uint32) node.MIGDevice {
		return node.MIGDevice{Parent: 0, ParentUUID: "GPU-0", UUID: fmt.Sprintf("MIG-%d-%d", gi, ci), GI: gi, CI: ci, Profile: "1g.10gb",
			GIAccess: caps(giCap), CIAccess: caps(ciCap), Health: node.Healthy()}
	}
	inv := &node.Inventory{Devices: []node.Device{
		{Index: 0, Minor: 0, UUID: "GPU-0", Node: node.DeviceNode{Path: "/dev/nvidia0", Major: 195, Minor: 0}, MIG: node.MIGEnabled,
			Health: node.Healthy(), MIGDevices: []node.MIGDevice{mig(7, 0, 66, 67), mig(8, 0, 75, 76)}},
		{Index: 1, Minor: 1, UUID: "GPU-1", Node: node.DeviceNode{Path: "/dev/nvidia1", Major: 195, Minor: 1}, Health: node.Healthy()},
	}}
	spec, err := cdi.New(inv)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string][]string{}
	for _, d := range spec.Devices {
		for _, n := range d.ContainerEdits.DeviceNodes {
			byName[d.Name] = append(byName[d.Name], fmt.Sprintf("%s=%d:%d", n.Path, n.Major, n.Minor))
		}
		byName[d.Name] = append(byName[d.Name], d.ContainerEdits.Env...)
	}
	for _, whole := range []string{"0", "GPU-0"} {
		if _, ok := byName[whole]; ok {
			t.Errorf("split GPU listed whole as %q", whole)
		}
	}
	want := []string{"/dev/nvidia0=195:0", "/dev/nvidia-caps/nvidia-cap66=241:66", "/dev/nvidia-caps/nvidia-cap67=241:67"}
	for _, name := range []string{"0:7:0", "MIG-7-0"} {
		if got := byName[name]; !slices.Equal(got, want) {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	if got := byName["all"]; !slices.Contains(got, "NVIDIA_VISIBLE_DEVICES=MIG-7-0,MIG-8-0,GPU-1") {
		t.Errorf("all = %v", got)
	}
	if _, ok := byName["1"]; !ok {
		t.Error("whole GPU 1 missing")
	}
}
