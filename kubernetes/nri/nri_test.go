package nri_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/containerd/nri/pkg/api"

	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/kubernetes/nri"
	"github.com/gpuiso/gpuiso/node"
)

// sysTree is a sys root whose NUMA node i has the CPUs cpulists[i];
// hasMemory, when not nil, is its has_memory list.
func sysTree(t *testing.T, hasMemory *string, cpulists ...string) string {
	t.Helper()
	root := t.TempDir()
	base := filepath.Join(root, "devices", "system", "node")
	for i, l := range cpulists {
		dir := filepath.Join(base, "node"+string(rune('0'+i)))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "cpulist"), []byte(l+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if hasMemory != nil {
		if err := os.WriteFile(filepath.Join(base, "has_memory"), []byte(*hasMemory+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// inventory has four GPUs, minors 0-3: 0 and 1 on NUMA node 0, 2 on node
// 1, 3 on an unknown node.
func inventory() *node.Inventory {
	return &node.Inventory{Devices: []node.Device{
		{Index: 0, Minor: 0, NUMANode: 0}, {Index: 1, Minor: 1, NUMANode: 0},
		{Index: 2, Minor: 2, NUMANode: 1}, {Index: 3, Minor: 3, NUMANode: node.NoNUMANode},
	}}
}

func gpuNode(minor int64) *api.LinuxDevice {
	return &api.LinuxDevice{Path: "/dev/nvidia" + string(rune('0'+minor)), Type: "c", Major: 195, Minor: minor}
}

func ctr(env []string, devs ...*api.LinuxDevice) *api.Container {
	return &api.Container{Name: "main", Env: env, Linux: &api.LinuxContainer{Devices: devs}}
}

func TestPlacement(t *testing.T) {
	mem0 := "0"
	sys := sysTree(t, &mem0, "0-3", "4-7")
	control := []*api.LinuxDevice{
		{Path: "/dev/nvidiactl", Type: "c", Major: 195, Minor: 255},
		{Path: "/dev/nvidia-uvm", Type: "c", Major: 511, Minor: 0},
	}
	tests := []struct {
		name       string
		policy     nri.Policy
		ctr        *api.Container
		cpus, mems string
	}{
		{"one GPU on node 0", nri.PolicyNUMA, ctr(nil, append(control, gpuNode(1))...), "0-3", "0"},
		{"one GPU on node 1 (no memory there)", nri.PolicyNUMA, ctr(nil, gpuNode(2)), "4-7", ""},
		{"GPUs on both nodes", nri.PolicyNUMA, ctr(nil, gpuNode(0), gpuNode(2)), "0-7", "0"},
		{"a GPU of unknown node", nri.PolicyNUMA, ctr(nil, gpuNode(0), gpuNode(3)), "", ""},
		{"no GPU", nri.PolicyNUMA, ctr(nil, control...), "", ""},
		{"an image's environment asks", nri.PolicyNUMA, ctr([]string{"NVIDIA_VISIBLE_DEVICES=all"}), "", ""},
		{"another driver's minor", nri.PolicyNUMA, ctr(nil, &api.LinuxDevice{Path: "/dev/nvidia9", Type: "c", Major: 195, Minor: 9}), "", ""},
		{"a name and minor that differ", nri.PolicyNUMA, ctr(nil, &api.LinuxDevice{Path: "/dev/nvidia2", Type: "c", Major: 195, Minor: 0}), "", ""},
		{"a block device", nri.PolicyNUMA, ctr(nil, &api.LinuxDevice{Path: "/dev/nvidia0", Type: "b", Major: 195, Minor: 0}), "", ""},
		{"policy none", nri.PolicyNone, ctr(nil, gpuNode(1)), "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := nri.New(inventory(), tt.policy, sys, nil)
			if err != nil {
				t.Fatal(err)
			}
			cpus, mems, err := p.Placement(tt.ctr)
			if err != nil || cpus != tt.cpus || mems != tt.mems {
				t.Errorf("Placement = %q, %q, %v; want %q, %q", cpus, mems, err, tt.cpus, tt.mems)
			}
			adj, updates, err := p.CreateContainer(t.Context(), &api.PodSandbox{Name: "p", Namespace: "ns"}, tt.ctr)
			if err != nil || updates != nil {
				t.Fatalf("CreateContainer: %v, %v", updates, err)
			}
			if tt.cpus == "" {
				if adj != nil {
					t.Errorf("adjusted %+v", adj)
				}
				return
			}
			got := adj.GetLinux().GetResources().GetCpu()
			if got.GetCpus() != tt.cpus || got.GetMems() != tt.mems {
				t.Errorf("adjustment cpus %q mems %q, want %q %q", got.GetCpus(), got.GetMems(), tt.cpus, tt.mems)
			}
		})
	}
}

// TestPlacementWithoutHasMemory: a kernel that does not list the nodes with
// memory has every GPU's node as a memory node.
func TestPlacementWithoutHasMemory(t *testing.T) {
	p, err := nri.New(inventory(), nri.PolicyNUMA, sysTree(t, nil, "0-3", "4-7"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if cpus, mems, err := p.Placement(ctr(nil, gpuNode(2))); cpus != "4-7" || mems != "1" || err != nil {
		t.Errorf("Placement = %q, %q, %v; want 4-7, 1", cpus, mems, err)
	}
}

// TestPlacementUnknownNode: a GPU on a NUMA node the host does not list
// fails the container's creation.
func TestPlacementUnknownNode(t *testing.T) {
	p, err := nri.New(inventory(), nri.PolicyNUMA, sysTree(t, nil, "0-3"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := p.CreateContainer(t.Context(), &api.PodSandbox{}, ctr(nil, gpuNode(2))); !errors.Is(err, isolator.ErrUnknownNUMANode) {
		t.Errorf("err = %v, want ErrUnknownNUMANode", err)
	}
}

func TestNewRefuses(t *testing.T) {
	for _, tc := range []struct {
		name   string
		inv    *node.Inventory
		policy nri.Policy
		sys    string
	}{
		{"bad policy", inventory(), "spread", ""},
		{"no inventory", nil, nri.PolicyNUMA, ""},
		{"relative sys root", inventory(), nri.PolicyNUMA, "sys"},
	} {
		if _, err := nri.New(tc.inv, tc.policy, tc.sys, nil); !errors.Is(err, node.ErrInvalid) {
			t.Errorf("%s: err = %v, want node.ErrInvalid", tc.name, err)
		}
	}
	if _, err := nri.ParsePolicy("numa"); err != nil {
		t.Error(err)
	}
}
