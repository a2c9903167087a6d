package native_test

import (
	"bytes"
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

// numaCPUs reads the host's NUMA nodes' CPU lists by node number.
func numaCPUs(t *testing.T) map[int]string {
	t.Helper()
	out := map[int]string{}
	paths, _ := filepath.Glob("/sys/devices/system/node/node*/cpulist")
	for _, p := range paths {
		var n int
		if _, err := fmt.Sscanf(filepath.Base(filepath.Dir(p)), "node%d", &n); err != nil {
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		out[n] = strings.TrimSpace(string(b))
	}
	return out
}

// hasCpuset tells whether the isolator's hierarchy can pin: v1 with its
// cpuset hierarchy, or a cgroup2 whose root offers cpuset.
func hasCpuset(n *testNode) bool {
	if n.version == cgroups.V1 {
		_, err := os.Stat(filepath.Join(cgroups.DefaultCpusetMount, "cpuset.cpus"))
		return err == nil
	}
	mount := strings.TrimSuffix(n.iso.Path("x"), "/"+n.iso.Parent()+"/x")
	b, _ := os.ReadFile(filepath.Join(mount, "cgroup.controllers"))
	return slices.Contains(strings.Fields(string(b)), "cpuset")
}

// TestCPUAffinity launches containers pinned to their GPUs' NUMA nodes on
// a simulated DGX-1 (GPUs 0-3 on node 0, 4-7 on node 1) and reads their
// Cpus_allowed_list and Mems_allowed_list from inside: GPU 4's node's
// CPUs, the union for GPUs 3 and 4. Where the host has no node 1, the
// launch on GPU 4 is refused (ErrUnknownNUMANode) and holds nothing; where
// the hierarchy has no cpuset (a hybrid host's cgroup2), it is not
// supported. A container not pinned has every CPU.
func TestCPUAffinity(t *testing.T) {
	versions(t, func(t *testing.T, n *testNode) {
		ctx := context.Background()
		cpus := numaCPUs(t)
		launch := func(id string, affinity containerizer.CPUAffinity, devices ...string) (string, error) {
			var out bytes.Buffer
			_, err := n.c.Launch(ctx, containerizer.Spec{ID: id, Command: []string{"/bin/sh", "-c", "grep -E '^(Cpus|Mems)_allowed_list' /proc/self/status"},
				GPUs: allocator.Request{Devices: devices}, CPUAffinity: affinity, Stdout: &out, Stderr: &out})
			if err != nil {
				return "", err
			}
			defer n.c.Destroy(ctx, id)
			if st, err := n.c.Wait(ctx, id); err != nil || st.Code != 0 {
				t.Fatalf("container %s: exit %d, %v\n%s", id, st.Code, err, out.String())
			}
			return out.String(), nil
		}
		want := func(cpus, mems string) string {
			return fmt.Sprintf("Cpus_allowed_list:\t%s\nMems_allowed_list:\t%s\n", cpus, mems)
		}
		all, err := launch("unpinned", containerizer.CPUAffinityNone, "4")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(all, "Cpus_allowed_list:\t"+status(t, os.Getpid(), "Cpus_allowed_list")) {
			t.Errorf("a container not pinned has %q, want this process's CPUs", all)
		}
		if !hasCpuset(n) {
			if _, err := launch("pinned-0", containerizer.CPUAffinityNUMA, "0"); !errors.Is(err, containerizer.ErrNotSupported) {
				t.Fatalf("launch pinned without a cpuset controller = %v, want ErrNotSupported", err)
			}
			if testenv.CgroupV2Only() {
				t.Fatal("a cgroup2-only host whose hierarchy offers no cpuset controller")
			}
			t.Skipf("no cpuset controller in the cgroup %s hierarchy (the cgroup2-only VM has one)", n.version)
		}
		got, err := launch("pinned-4", containerizer.CPUAffinityNUMA, "4")
		switch {
		case cpus[1] == "":
			if !errors.Is(err, isolator.ErrUnknownNUMANode) {
				t.Fatalf("launch pinned to NUMA node 1 on a host without it = %v, want ErrUnknownNUMANode", err)
			}
			if _, err := n.alloc.Allocation("pinned-4"); !errors.Is(err, allocator.ErrUnknownOwner) {
				t.Errorf("the refused launch holds its GPU (%v)", err)
			}
			got, err := launch("pinned-0", containerizer.CPUAffinityNUMA, "0")
			if err != nil || got != want(cpus[0], "0") {
				t.Errorf("pinned to GPU 0's node: %q, %v; want %q", got, err, want(cpus[0], "0"))
			}
			testenv.RequireNUMA(t, "") // skips here: the cgroup2-only VM has two nodes
		case err != nil:
			t.Fatal(err)
		}
		if got != want(cpus[1], "1") {
			t.Errorf("pinned to GPU 4's node: %q, want %q", got, want(cpus[1], "1"))
		}
		l0, _ := isolator.ParseList(cpus[0])
		l1, _ := isolator.ParseList(cpus[1])
		union := isolator.FormatList(append(l0, l1...))
		if got, err := launch("pinned-3-4", containerizer.CPUAffinityNUMA, "3", "4"); err != nil || got != want(union, "0-1") {
			t.Errorf("pinned to GPUs 3 and 4: %q, %v; want %q", got, err, want(union, "0-1"))
		}
	})
}

// status reads one field of /proc/<pid>/status.
func status(t *testing.T, pid int, field string) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for l := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("/proc/%d/status has no %s", pid, field)
	return ""
}

// hostVersion is the cgroup version a runtime picks on this host: v2 on a
// cgroup2-only host, v1 (its devices controller) on a hybrid one.
func hostVersion() cgroups.Version {
	if testenv.CgroupV2Only() {
		return cgroups.V2
	}
	return cgroups.V1
}
