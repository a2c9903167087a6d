package linux_test

import (
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
)

// TestCgroupPlacement makes a cgroup in every hierarchy of the host, moves
// a process into it (in the cgroup namespace the caller names), finds
// it there in each, and removes the cgroup once the process ended.
func TestCgroupPlacement(t *testing.T) {
	testenv.RequireRoot(t)
	hs, err := linux.CgroupHierarchies("/sys/fs/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	top := fmt.Sprintf("/gpuiso-test-place-%d", os.Getpid())
	p := top + "/gpuiso-mps/owner-1"
	t.Cleanup(func() {
		linux.RemoveCgroup(hs, p)
		linux.RemoveCgroup(hs, top+"/gpuiso-mps")
		linux.RemoveCgroup(hs, top)
	})
	if err := linux.MakeCgroup(hs, p); err != nil {
		t.Fatal(err)
	}
	if err := linux.MakeCgroup(hs, p); err != nil {
		t.Fatalf("made again: %v", err)
	}
	cmd := exec.Command("sleep", "100")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	if err := linux.MoveToCgroup(hs, p, cmd.Process.Pid, "/proc/self/ns/cgroup"); err != nil {
		t.Fatal(err)
	}
	for _, h := range hs {
		pids, err := linux.CgroupProcesses(h, p)
		if err != nil || !slices.Contains(pids, cmd.Process.Pid) {
			t.Errorf("%s: processes %v (%v), want %d", h.Dir, pids, err, cmd.Process.Pid)
		}
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	cgs, err := linux.ProcCgroups(b)
	if err != nil {
		t.Fatal(err)
	}
	if cgs["memory"] != "" && cgs["memory"] != p {
		t.Errorf("the process's memory cgroup is %s, want %s", cgs["memory"], p)
	}
	if err := linux.RemoveCgroup(hs, p); err == nil {
		t.Error("a cgroup with a process in it was removed")
	}
	cmd.Process.Kill()
	cmd.Wait()
	if err := linux.RemoveCgroup(hs, p); err != nil {
		t.Fatal(err)
	}
	for _, h := range hs {
		if _, err := os.Stat(filepath.Join(h.Dir, p)); !os.IsNotExist(err) {
			t.Errorf("%s: left: %v", h.Dir, err)
		}
	}
	if err := linux.RemoveCgroup(hs, p); err != nil {
		t.Errorf("removed again: %v", err)
	}
	if err := linux.MakeCgroup(hs, "/a/../b"); err == nil {
		t.Error("a path leaving the hierarchy was made")
	}
}

// TestStartDaemonFrom: a daemon started from another process's mount
// namespace sees that namespace's mounts, which its starter does not.
func TestStartDaemonFrom(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	holder := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c",
		"mount -t tmpfs gpuiso-test "+dir+" && echo seen > "+dir+"/f && echo ready && exec sleep 100")
	out, err := holder.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	defer holder.Wait()
	defer holder.Process.Kill()
	if _, err := out.Read(make([]byte, 6)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "f")); err == nil {
		t.Fatal("the namespace's tmpfs reached the test's")
	}
	var got strings.Builder
	cmd := exec.Command("/bin/cat", filepath.Join(dir, "f"))
	cmd.Stdout, cmd.Stderr = &got, &got
	ns := fmt.Sprintf("/proc/%d/ns/mnt", holder.Process.Pid)
	if err := linux.StartDaemonFrom(cmd, ns, nil); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	if strings.TrimSpace(got.String()) != "seen" {
		t.Errorf("the daemon read %q, want the namespace's file", got.String())
	}
}

// TestOwnCgroupsNamespace: the caller's cgroups are read as the cgroup
// namespace named shows them (from a thread that joined it): from one
// rooted at a cgroup below the caller's, the caller's own lies above its
// root.
func TestOwnCgroupsNamespace(t *testing.T) {
	testenv.RequireRoot(t)
	hs, err := linux.CgroupHierarchies("/sys/fs/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	var v2 []linux.CgroupHierarchy
	for _, h := range hs {
		if h.V2 {
			v2 = append(v2, h)
		}
	}
	if len(v2) == 0 {
		t.Skip("no cgroup v2 hierarchy")
	}
	own, err := linux.OwnCgroups("")
	if err != nil {
		t.Fatal(err)
	}
	narrow := path.Join(own[""], fmt.Sprintf("gpuiso-test-ns-%d", os.Getpid()))
	t.Cleanup(func() { linux.RemoveCgroup(v2, narrow) })
	if err := linux.MakeCgroup(v2, narrow); err != nil {
		t.Fatal(err)
	}
	// A process whose cgroup namespace is rooted at narrow.
	holder := exec.Command("sh", "-c", "echo $$ > "+filepath.Join(v2[0].Dir, narrow, "cgroup.procs")+" && exec unshare --cgroup sleep 100")
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	defer holder.Wait()
	defer holder.Process.Kill()
	ns := fmt.Sprintf("/proc/%d/ns/cgroup", holder.Process.Pid)
	ownNS, err := os.Readlink("/proc/self/ns/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; {
		if l, err := os.Readlink(ns); err == nil && l != ownNS {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the holder never entered a cgroup namespace of its own")
		}
		time.Sleep(10 * time.Millisecond)
	}
	seen, err := linux.OwnCgroups(ns)
	if err != nil {
		t.Fatal(err)
	}
	if seen[""] != "/.." {
		t.Errorf("from the namespace rooted at %s the caller's cgroup %s reads %q, want /..", narrow, own[""], seen[""])
	}
	if again, err := linux.OwnCgroups(""); err != nil || again[""] != own[""] {
		t.Errorf("the caller's own namespace changed: %v, %v", again, err)
	}
	holder.Process.Kill()
}
