package isolator_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/node"
)

// numaInv is a four-GPU node: GPUs 0 and 1 on NUMA node 0, 2 and 3 on node
// 1, GPU 0 split into a MIG device. A node with NUMA -1 for every GPU is
// what NVML reports on many servers (an H100 node, REFERENCE §9).
func numaInv(numa ...int) *node.Inventory {
	inv := &node.Inventory{ControlDevices: []node.ControlDevice{{Name: node.NVIDIACtl, Path: "/dev/nvidiactl", Major: 195, Minor: 255}}}
	for i, n := range numa {
		inv.Devices = append(inv.Devices, node.Device{Index: i, Minor: i, UUID: fmt.Sprintf("GPU-%08d-0000-0000-0000-000000000000", i),
			NUMANode: n, Node: node.DeviceNode{Path: fmt.Sprintf("/dev/nvidia%d", i), Major: 195, Minor: uint32(i)}})
	}
	return inv
}

// sysTree writes a sys root whose NUMA nodes have the given CPU lists.
func sysTree(t *testing.T, cpulists ...string) string {
	t.Helper()
	root := t.TempDir()
	for n, l := range cpulists {
		dir := filepath.Join(root, "devices", "system", "node", fmt.Sprintf("node%d", n))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "cpulist"), []byte(l+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// TestPlanCPUAffinity: a plan asked to pin its container gets the CPUs and
// memory nodes of its GPUs' NUMA nodes (the union across nodes); one not
// asked, or with no GPU, or with a GPU of unknown NUMA node, pins nothing;
// a NUMA node the host lacks is ErrUnknownNUMANode.
func TestPlanCPUAffinity(t *testing.T) {
	sys := sysTree(t, "0-3,8-11", "4-7,12-15")
	for _, tc := range []struct {
		name       string
		numa       []int
		gpus       []int
		opts       []isolator.PlanOption
		cpus, mems string
		err        error
	}{
		{name: "one node", numa: []int{0, 0, 1, 1}, gpus: []int{2}, opts: []isolator.PlanOption{isolator.WithCPUAffinity(sys)}, cpus: "4-7,12-15", mems: "1"},
		{name: "two GPUs of one node", numa: []int{0, 0, 1, 1}, gpus: []int{0, 1}, opts: []isolator.PlanOption{isolator.WithCPUAffinity(sys)}, cpus: "0-3,8-11", mems: "0"},
		{name: "spanning nodes: the union", numa: []int{0, 0, 1, 1}, gpus: []int{1, 2}, opts: []isolator.PlanOption{isolator.WithCPUAffinity(sys)}, cpus: "0-15", mems: "0-1"},
		{name: "not asked", numa: []int{0, 0, 1, 1}, gpus: []int{2}},
		{name: "no GPU", numa: []int{0, 0, 1, 1}, opts: []isolator.PlanOption{isolator.WithCPUAffinity(sys)}},
		{name: "no NUMA information", numa: []int{-1, -1, -1, -1}, gpus: []int{0, 3}, opts: []isolator.PlanOption{isolator.WithCPUAffinity(sys)}},
		{name: "one GPU without NUMA information", numa: []int{0, -1, 1, 1}, gpus: []int{0, 1}, opts: []isolator.PlanOption{isolator.WithCPUAffinity(sys)}},
		{name: "a node the host lacks", numa: []int{0, 0, 1, 3}, gpus: []int{3}, opts: []isolator.PlanOption{isolator.WithCPUAffinity(sys)}, err: isolator.ErrUnknownNUMANode},
		{name: "relative sys root", numa: []int{0}, gpus: []int{0}, opts: []isolator.PlanOption{isolator.WithCPUAffinity("sys")}, err: node.ErrInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inv := numaInv(tc.numa...)
			var refs []node.DeviceRef
			for _, g := range tc.gpus {
				refs = append(refs, inv.Devices[g].Ref())
			}
			p, err := isolator.NewPlan("task-1", inv, refs, nil, nil, tc.opts...)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("NewPlan: %v, want %v", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if p.CPUs != tc.cpus || p.Mems != tc.mems {
				t.Errorf("CPUs %q, Mems %q; want %q, %q", p.CPUs, p.Mems, tc.cpus, tc.mems)
			}
		})
	}
}

// TestPlanCPUAffinityMIG: a MIG device is local to its parent GPU's node.
func TestPlanCPUAffinityMIG(t *testing.T) {
	inv := migInv()
	inv.Devices[0].NUMANode, inv.Devices[1].NUMANode = 1, 0
	ref := inv.Devices[0].MIGRef(inv.Devices[0].MIGDevices[0])
	p, err := isolator.NewPlan("task-1", inv, []node.DeviceRef{ref}, nil, nil, isolator.WithCPUAffinity(sysTree(t, "0", "1")))
	if err != nil {
		t.Fatal(err)
	}
	if p.CPUs != "1" || p.Mems != "1" {
		t.Errorf("CPUs %q, Mems %q; want the parent's node 1", p.CPUs, p.Mems)
	}
}

func TestParseList(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []int
		bad  bool
	}{
		{in: "", want: nil},
		{in: "0", want: []int{0}},
		{in: "0-3,8", want: []int{0, 1, 2, 3, 8}},
		{in: "8,0-1,1", want: []int{0, 1, 8}},
		{in: "3-1", bad: true},
		{in: "a", bad: true},
		{in: "1,", bad: true},
		{in: "-1", bad: true},
		{in: "1-", bad: true},
		{in: "0-70000", bad: true},
	} {
		got, err := isolator.ParseList(tc.in)
		if (err != nil) != tc.bad || !slices.Equal(got, tc.want) {
			t.Errorf("ParseList(%q) = %v, %v; want %v (error %v)", tc.in, got, err, tc.want, tc.bad)
		}
		if err != nil && !errors.Is(err, node.ErrInvalid) {
			t.Errorf("ParseList(%q): %v does not match node.ErrInvalid", tc.in, err)
		}
	}
}

func TestFormatList(t *testing.T) {
	for _, tc := range []struct {
		in   []int
		want string
	}{
		{nil, ""},
		{[]int{0}, "0"},
		{[]int{3, 0, 1, 2, 8, 2}, "0-3,8"},
		{[]int{1, 3, 5}, "1,3,5"},
		{[]int{4, 5, 10, 11, 12}, "4-5,10-12"},
	} {
		if got := isolator.FormatList(tc.in); got != tc.want {
			t.Errorf("FormatList(%v) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// FuzzParseList: what ParseList accepts, FormatList writes back to a list
// that parses to the same numbers.
func FuzzParseList(f *testing.F) {
	for _, s := range []string{"", "0", "0-3,8-11", "1,1,1", "5-5", "0-1,a", "65535"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ns, err := isolator.ParseList(s)
		if err != nil {
			return
		}
		again, err := isolator.ParseList(isolator.FormatList(ns))
		if err != nil || !slices.Equal(again, ns) {
			t.Fatalf("ParseList(%q) = %v; its format %q parses to %v, %v", s, ns, isolator.FormatList(ns), again, err)
		}
	})
}
