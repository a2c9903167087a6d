package cgroups_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/isolator/cgroups"
	"github.com/gpuiso/gpuiso/node"
)

// lastOf is the highest number of a kernel list file ("0-3" gives "3").
func lastOf(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	l, err := isolator.ParseList(strings.TrimSpace(string(b)))
	if err != nil || len(l) == 0 {
		t.Fatalf("%s: %v, %v", path, l, err)
	}
	return fmt.Sprint(l[len(l)-1])
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

// TestSetCPUs pins a container to the host's last CPU and memory node: a
// process moved in afterwards has them as its Cpus_allowed_list and
// Mems_allowed_list, and Destroy leaves no cgroup (v1: the cpuset one too).
// Where cgroup2 has no cpuset controller (a hybrid host's), SetCPUs says
// it is not supported and changes nothing.
func TestSetCPUs(t *testing.T) {
	versions(t, func(t *testing.T, v cgroups.Version) {
		f := newFixture(t, v)
		ctx := context.Background()
		const owner = "pinned"
		mount := strings.TrimSuffix(f.iso.Path(owner), "/"+f.iso.Parent()+"/"+owner)
		if v == cgroups.V1 {
			t.Cleanup(func() { os.Remove(filepath.Join(cgroups.DefaultCpusetMount, f.iso.Parent())) })
		}
		if err := f.iso.Apply(ctx, owner, f.rules(1)); err != nil {
			t.Fatal(err)
		}
		defer f.iso.Destroy(ctx, owner)
		cpu := lastOf(t, "/sys/devices/system/cpu/online")
		mem := lastOf(t, "/sys/devices/system/node/online")
		err := f.iso.SetCPUs(ctx, owner, cpu, mem)
		if b, _ := os.ReadFile(filepath.Join(mount, "cgroup.controllers")); v == cgroups.V2 && !slices.Contains(strings.Fields(string(b)), "cpuset") {
			if !errors.Is(err, isolator.ErrNotSupported) {
				t.Fatalf("SetCPUs on a cgroup2 without cpuset = %v, want ErrNotSupported", err)
			}
			t.Skipf("cgroup2 at %s has no cpuset controller (its controllers are v1's); the cgroup2-only VM runs this", mount)
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := f.iso.SetCPUs(ctx, owner, "", mem); !errors.Is(err, node.ErrInvalid) {
			t.Fatalf("SetCPUs with no CPUs = %v, want node.ErrInvalid", err)
		}
		p := testenv.StartProber(t, func(pid int) error { return f.iso.AddProcess(ctx, owner, pid) })
		if got := status(t, p.Pid, "Cpus_allowed_list"); got != cpu {
			t.Errorf("Cpus_allowed_list %q, want %q", got, cpu)
		}
		if got := status(t, p.Pid, "Mems_allowed_list"); got != mem {
			t.Errorf("Mems_allowed_list %q, want %q", got, mem)
		}
		f.check(t, p, 1)
		if err := f.iso.Destroy(ctx, owner); err != nil {
			t.Fatal(err)
		}
		left := []string{f.iso.Path(owner)}
		if v == cgroups.V1 {
			left = append(left, filepath.Join(cgroups.DefaultCpusetMount, f.iso.Parent(), owner))
		}
		for _, dir := range left {
			if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s left after Destroy (%v)", dir, err)
			}
		}
		if err := f.iso.RemoveParent(); err != nil {
			t.Fatal(err)
		}
		if v == cgroups.V1 {
			if _, err := os.Stat(filepath.Join(cgroups.DefaultCpusetMount, f.iso.Parent())); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the cpuset parent is left after RemoveParent (%v)", err)
			}
		}
	})
}
