package isolator_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/node"
)

// migInv is a node whose GPU 0 (MIG enabled) holds two MIG devices and whose
// GPU 1 is whole; the capability nodes are on major 241 as on a real node.
func migInv() *node.Inventory {
	cap := func(m uint32) node.DeviceNode {
		return node.DeviceNode{Path: fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", m), Major: 241, Minor: m}
	}
	parent := "GPU-aaaaaaaa-0000-0000-0000-000000000000"
	return &node.Inventory{
		Devices: []node.Device{
			{Index: 0, Minor: 0, UUID: parent, MIG: node.MIGEnabled, Node: node.DeviceNode{Path: "/dev/nvidia0", Major: 195, Minor: 0},
				MIGDevices: []node.MIGDevice{
					{Parent: 0, ParentUUID: parent, UUID: "MIG-11111111-0000-0000-0000-000000000000", GI: 1, CI: 0, Profile: "3g.40gb", GIAccess: cap(12), CIAccess: cap(13)},
					{Parent: 0, ParentUUID: parent, UUID: "MIG-22222222-0000-0000-0000-000000000000", GI: 2, CI: 0, Profile: "3g.40gb", GIAccess: cap(21), CIAccess: cap(22)},
				}},
			{Index: 1, Minor: 1, UUID: "GPU-aaaaaaaa-0000-0000-0000-000000000001", Node: node.DeviceNode{Path: "/dev/nvidia1", Major: 195, Minor: 1}},
		},
		ControlDevices: []node.ControlDevice{
			{Name: node.NVIDIACtl, Path: "/dev/nvidiactl", Major: 195, Minor: 255},
			{Name: node.NVIDIAUVM, Path: "/dev/nvidia-uvm", Major: 238, Minor: 0},
		},
	}
}

// TestPlanMIG pins what a container with one MIG device gets: its parent's
// node, the control nodes, the GI and CI capability nodes, the MIG UUID in
// the environment, and nothing of the sibling instance.
func TestPlanMIG(t *testing.T) {
	inv := migInv()
	ref := inv.Devices[0].MIGRef(inv.Devices[0].MIGDevices[1])
	p, err := isolator.NewPlan("task-1", inv, []node.DeviceRef{ref}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	var devs []string
	for _, d := range p.Devices {
		devs = append(devs, fmt.Sprintf("%s %s %d:%d", d.Path, d.HostPath, d.Major, d.Minor))
	}
	wantDevs := []string{
		"/dev/nvidiactl /dev/nvidiactl 195:255",
		"/dev/nvidia-uvm /dev/nvidia-uvm 238:0",
		"/dev/nvidia0 /dev/nvidia0 195:0",
		"/dev/nvidia-caps/nvidia-cap21 /dev/nvidia-caps/nvidia-cap21 241:21",
		"/dev/nvidia-caps/nvidia-cap22 /dev/nvidia-caps/nvidia-cap22 241:22",
	}
	if strings.Join(devs, "\n") != strings.Join(wantDevs, "\n") {
		t.Fatalf("devices =\n%s\nwant\n%s", strings.Join(devs, "\n"), strings.Join(wantDevs, "\n"))
	}
	var rules []string
	for _, r := range p.Rules[len(isolator.DefaultRules()):] {
		rules = append(rules, r.String())
	}
	wantRules := []string{"c 195:0 rwm", "c 195:255 rwm", "c 238:0 rwm", "c 241:21 rwm", "c 241:22 rwm"}
	if strings.Join(rules, "\n") != strings.Join(wantRules, "\n") {
		t.Fatalf("GPU rules =\n%s\nwant\n%s", strings.Join(rules, "\n"), strings.Join(wantRules, "\n"))
	}
	if p.Env[0] != "NVIDIA_VISIBLE_DEVICES=MIG-22222222-0000-0000-0000-000000000000" ||
		p.Env[1] != "CUDA_VISIBLE_DEVICES=MIG-22222222-0000-0000-0000-000000000000" {
		t.Fatalf("env %q", p.Env)
	}
}

// TestPlanMIGSiblingsAndWhole: two MIG devices of one GPU share its node
// once; a whole GPU beside them keeps its own.
func TestPlanMIGSiblingsAndWhole(t *testing.T) {
	inv := migInv()
	refs := []node.DeviceRef{inv.Devices[0].MIGRef(inv.Devices[0].MIGDevices[0]), inv.Devices[0].MIGRef(inv.Devices[0].MIGDevices[1]), inv.Devices[1].Ref()}
	p, err := isolator.NewPlan("task-2", inv, refs, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, d := range p.Devices {
		if d.Path == "/dev/nvidia0" {
			n++
		}
	}
	if n != 1 || len(p.Devices) != 2+1+4+1 {
		t.Fatalf("devices %+v", p.Devices)
	}
	if !strings.HasSuffix(p.Env[0], "MIG-11111111-0000-0000-0000-000000000000,MIG-22222222-0000-0000-0000-000000000000,GPU-aaaaaaaa-0000-0000-0000-000000000001") {
		t.Fatalf("env %q", p.Env[0])
	}
}

func TestPlanMIGRejects(t *testing.T) {
	inv := migInv()
	good := inv.Devices[0].MIGRef(inv.Devices[0].MIGDevices[0])
	otherCaps := good
	otherMIG := *good.MIG
	otherMIG.CIAccess.Minor = 22 // a sibling's capability
	otherCaps.MIG = &otherMIG
	unknown := good
	unknown.UUID = "MIG-99999999-0000-0000-0000-000000000000"
	noCaps := migInv()
	noCaps.Devices[0].MIGDevices[0].GIAccess = node.DeviceNode{}
	tests := map[string]struct {
		inv  *node.Inventory
		ref  node.DeviceRef
		want error
	}{
		"sibling's capability": {inv, otherCaps, isolator.ErrUnknownGPU},
		"unknown MIG device":   {inv, unknown, isolator.ErrUnknownGPU},
		"no capability nodes":  {noCaps, noCaps.Devices[0].MIGRef(noCaps.Devices[0].MIGDevices[0]), isolator.ErrNoMIGCaps},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			if _, err := isolator.NewPlan("task-3", tt.inv, []node.DeviceRef{tt.ref}, nil, nil); !errors.Is(err, tt.want) {
				t.Fatalf("NewPlan = %v, want %v", err, tt.want)
			}
		})
	}
}
