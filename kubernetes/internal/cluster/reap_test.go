package cluster

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
)

// TestReap: a cluster whose owner died is torn down by the next Start
// (Reap): a process in its cgroup, one naming its directory, a mount
// below it, its cgroups and the directory go. Clusters whose owner lives,
// or that have no owner yet, are left alone.
func TestReap(t *testing.T) {
	devices := testenv.RequireCgroupV1Devices(t)
	parent := t.TempDir()
	self, err := linux.Self("")
	if err != nil {
		t.Fatal(err)
	}
	owners := map[string]string{
		"k8s-0badc0de": linux.Process{Pid: self.Pid, Start: self.Start + 1}.String(), // that pid, started at another time: dead
		"k8s-11ve":     self.String(),
		"k8s-new":      "",
	}
	for name, owner := range owners {
		if err := os.MkdirAll(filepath.Join(parent, name, "m"), 0o755); err != nil {
			t.Fatal(err)
		}
		if owner != "" {
			if err := os.WriteFile(filepath.Join(parent, name, ownerFile), []byte(owner), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	stale := filepath.Join(parent, "k8s-0badc0de")
	if err := os.WriteFile(filepath.Join(stale, "log"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cg := filepath.Join(devices, "gpuiso-k8s-0badc0de")
	if err := os.MkdirAll(filepath.Join(cg, "kubepods"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		os.Remove(filepath.Join(cg, "kubepods"))
		os.Remove(cg)
	})
	if err := linux.BindMount(filepath.Join(stale, "m"), filepath.Join(stale, "m"), false); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { linux.DetachUnmount(filepath.Join(stale, "m")) })

	inCg := exec.Command("sleep", "1000")
	naming := exec.Command("tail", "-f", filepath.Join(stale, "log"))
	for _, cmd := range []*exec.Cmd{inCg, naming} {
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill() })
	}
	if err := os.WriteFile(filepath.Join(cg, "kubepods", "cgroup.procs"), []byte(strconv.Itoa(inCg.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	// The processes are this test's children: reap each as it dies.
	for _, cmd := range []*exec.Cmd{inCg, naming} {
		go cmd.Wait()
	}

	reaped, err := Reap(parent)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(reaped, []string{stale}) {
		t.Errorf("reaped %v, want %v", reaped, []string{stale})
	}
	c := &Cluster{Dir: stale, cgroupName: "gpuiso-k8s-0badc0de"}
	if left := c.Leftovers(); len(left) > 0 {
		t.Errorf("left of the stale cluster: %v", left)
	}
	for name := range owners {
		if _, err := os.Stat(filepath.Join(parent, name)); (name == "k8s-0badc0de") != os.IsNotExist(err) {
			t.Errorf("%s: %v", name, err)
		}
	}
}
