package chain

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/isolator/cgroups"
)

// TestCPUAffinity: an isolator made with CPUAffinityNUMA pins the process
// it isolates to its GPU's NUMA node, for each cgroup version: on a host
// with two NUMA nodes (the cgroup2-only VM) GPU 4 of a simulated DGX-1
// gives node 1's CPUs and memory; on a host with one, GPU 0 gives node 0's
// and GPU 4 is refused with ErrUnknownNUMANode, holding nothing. Cleanup
// leaves no cgroup (v1: no cpuset cgroup either).
func TestCPUAffinity(t *testing.T) {
	for _, tc := range []struct {
		version cgroups.Version
		require func(testing.TB) string
	}{
		{cgroups.V1, testenv.RequireCgroupV1Devices},
		{cgroups.V2, testenv.RequireCgroupV2},
	} {
		t.Run(tc.version.String(), func(t *testing.T) {
			mount := tc.require(t)
			if b, _ := os.ReadFile(filepath.Join(mount, "cgroup.controllers")); tc.version == cgroups.V2 && !slices.Contains(strings.Fields(string(b)), "cpuset") {
				if testenv.CgroupV2Only() {
					t.Fatal("a cgroup2-only host whose hierarchy offers no cpuset controller")
				}
				t.Skipf("no cpuset controller in the cgroup2 hierarchy at %s (the cgroup2-only VM has one)", mount)
			}
			ctx := context.Background()
			_, _, inv := testenv.SimulatedNode(t, "dgx1-volta")
			a, err := allocator.New(inv)
			if err != nil {
				t.Fatal(err)
			}
			cg, err := cgroups.New(cgroups.WithVersion(tc.version), cgroups.WithMount(mount))
			if err != nil {
				t.Fatal(err)
			}
			iso, err := New(Config{Allocator: a, Inventory: inv, StateDir: t.TempDir(), Cgroups: cg, CPUAffinity: containerizer.CPUAffinityNUMA})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { iso.Close() })
			node1, err := os.ReadFile("/sys/devices/system/node/node1/cpulist")
			gpu, cpus, mems := "4", strings.TrimSpace(string(node1)), "1"
			if err != nil {
				if _, err := iso.Prepare(ctx, "far", allocator.Request{Devices: []string{"4"}}, containerizer.Image{}); !errors.Is(err, isolator.ErrUnknownNUMANode) {
					t.Fatalf("Prepare on NUMA node 1 of a host without it = %v, want ErrUnknownNUMANode", err)
				}
				if len(a.Allocations()) != 0 {
					t.Fatalf("a refused Prepare holds %v", a.Allocations())
				}
				node0, err := os.ReadFile("/sys/devices/system/node/node0/cpulist")
				if err != nil {
					t.Fatal(err)
				}
				gpu, cpus, mems = "0", strings.TrimSpace(string(node0)), "0"
			}
			if _, err := iso.Prepare(ctx, "c1", allocator.Request{Devices: []string{gpu}}, containerizer.Image{}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { iso.Cleanup(context.Background(), "c1") })
			p := testenv.StartProber(t, func(pid int) error { return iso.Isolate(ctx, "c1", pid) })
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.Pid))
			if err != nil {
				t.Fatal(err)
			}
			for _, want := range []string{"Cpus_allowed_list:\t" + cpus + "\n", "Mems_allowed_list:\t" + mems + "\n"} {
				if !strings.Contains(string(b), want) {
					t.Errorf("the isolated process of GPU %s lacks %q:\n%s", gpu, want, b)
				}
			}
			if err := iso.Cleanup(ctx, "c1"); err != nil {
				t.Fatal(err)
			}
			left := []string{filepath.Join(mount, iso.Parent())}
			if tc.version == cgroups.V1 {
				left = append(left, filepath.Join(cgroups.DefaultCpusetMount, iso.Parent()))
			}
			for _, dir := range left {
				if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s left after Cleanup (%v)", dir, err)
				}
			}
		})
	}
}
