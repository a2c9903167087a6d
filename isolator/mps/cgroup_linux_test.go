package mps_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/isolator/mps"
)

// TestDaemonCgroup: with WithCgroup each daemon runs in a cgroup of its
// own, <parent>/gpuiso-mps/<owner>, in every hierarchy of the host (its
// record names it); stopping it removes that cgroup, and the last one
// stopped removes gpuiso-mps too. The daemons' mount namespaces are made
// from the test's own, named (WithMountNamespace), as a plugin in a pod
// names its runtime's.
func TestDaemonCgroup(t *testing.T) {
	_, _ = newManager(t) // the gates: root, the MPS binary
	hs, err := linux.CgroupHierarchies(mps.DefaultCgroupRoot)
	if err != nil {
		t.Fatal(err)
	}
	parent := fmt.Sprintf("/gpuiso-test-mps-%d", os.Getpid())
	t.Cleanup(func() { linux.RemoveCgroup(hs, parent) })
	m, err := mps.New(filepath.Join(t.TempDir(), "mps"), mps.WithCgroup(parent),
		mps.WithMountNamespace(fmt.Sprintf("/proc/%d/ns/mnt", os.Getpid()), ""))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ctx := context.Background()
	var ds []mps.Daemon
	for i, owner := range []string{"ctr-a", "ctr-b"} {
		d, err := m.Start(ctx, owner, gpu(i), mps.Limits{MemoryBytes: gib})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Stop(ctx, owner)
		if want := parent + "/gpuiso-mps/" + owner; d.Cgroup != want {
			t.Fatalf("daemon of %s in cgroup %q, want %q", owner, d.Cgroup, want)
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", d.Pid))
		if err != nil {
			t.Fatal(err)
		}
		cgs, err := linux.ProcCgroups(b)
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range hs {
			key := h.Controllers
			if h.V2 {
				key = ""
			}
			if p, ok := cgs[key]; ok && p != d.Cgroup {
				t.Errorf("daemon %d is in %s cgroup %s, want %s", d.Pid, h.Dir, p, d.Cgroup)
			}
			pids, err := linux.CgroupProcesses(h, d.Cgroup)
			if err != nil || len(pids) != 1 || pids[0] != d.Pid {
				t.Errorf("%s%s holds %v (%v), want the daemon %d", h.Dir, d.Cgroup, pids, err, d.Pid)
			}
		}
		listed, err := m.List(ctx)
		if err != nil || len(listed) != i+1 || listed[i].Cgroup != d.Cgroup {
			t.Errorf("listed %+v (%v), want the daemon's cgroup recorded", listed, err)
		}
		ds = append(ds, d)
	}
	exists := func(p string) bool {
		_, err := os.Stat(filepath.Join(hs[0].Dir, p))
		return err == nil
	}
	if err := m.Stop(ctx, "ctr-a"); err != nil {
		t.Fatal(err)
	}
	if exists(ds[0].Cgroup) || !exists(ds[1].Cgroup) {
		t.Errorf("after ctr-a stopped: its cgroup exists %v, ctr-b's %v", exists(ds[0].Cgroup), exists(ds[1].Cgroup))
	}
	if err := m.Stop(ctx, "ctr-b"); err != nil {
		t.Fatal(err)
	}
	for _, h := range hs {
		if _, err := os.Stat(filepath.Join(h.Dir, parent, mps.CgroupDir)); !os.IsNotExist(err) {
			t.Errorf("%s: %s/gpuiso-mps left: %v", h.Dir, parent, err)
		}
	}
}
