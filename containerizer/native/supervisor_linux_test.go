package native_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer/native"
)

// startAgent runs an agent process that launches launch and stays alive
// until killed.
func startAgent(t *testing.T, n *testNode, launch map[string]string) *exec.Cmd {
	t.Helper()
	b, _ := json.Marshal(agentConfig{Dirs: n.dirs, Version: n.version, Parent: n.parentCG, Launch: launch})
	exe, _ := os.Executable()
	agent := exec.Command(exe, "-test.run=^$")
	agent.Env = append(os.Environ(), agentEnv+"="+string(b))
	agent.Stderr = os.Stderr
	out, _ := agent.StdoutPipe()
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(out).ReadString('\n')
	if line != "ready\n" {
		agent.Process.Kill()
		agent.Wait()
		t.Fatalf("agent: %q", line)
	}
	t.Cleanup(func() { agent.Process.Kill(); agent.Wait() })
	return agent
}

// TestRecoverSparesLiveNeighbour: a second containerizer on the same state
// directory and cgroup parent recovers and cleans without touching the
// container a live process supervises; once that process dies, Clean gives
// back everything the container held.
func TestRecoverSparesLiveNeighbour(t *testing.T) {
	versions(t, func(t *testing.T, n *testNode) {
		ctx := context.Background()
		agent := startAgent(t, n, map[string]string{"neighbour": "sleep 1000"})
		// The init, then its command once the container is set up: the
		// sleep itself (on a slow machine the shell that runs it is seen
		// first, and is gone by the next look).
		var pids []int
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			var err error
			if pids, err = n.iso.Processes(ctx, "neighbour"); err == nil && len(pids) >= 2 && slices.ContainsFunc(pids, isSleep) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the neighbour's command never ran: %v %v", pids, err)
			}
		}
		fresh := mustOpen(t, n)
		if re, err := fresh.c.Recover(ctx); err != nil || len(re) != 0 {
			t.Fatalf("Recover = %v, %v; want nothing adopted", re, err)
		}
		if cleaned, err := fresh.c.Clean(ctx); err != nil || len(cleaned) != 0 {
			t.Fatalf("Clean = %v, %v; want nothing cleaned", cleaned, err)
		}
		after, err := n.iso.Processes(ctx, "neighbour")
		for _, p := range pids {
			if err != nil || !slices.Contains(after, p) {
				t.Fatalf("the neighbour's processes went from %v to %v (%v)", pids, after, err)
			}
		}
		if _, err := n.alloc.Allocation("neighbour"); err != nil {
			t.Fatalf("the neighbour lost its GPUs: %v", err)
		}

		agent.Process.Signal(syscall.SIGKILL)
		agent.Wait()
		cleaned, err := fresh.c.Clean(ctx)
		if err != nil || !slices.Equal(cleaned, []string{"neighbour"}) {
			t.Fatalf("Clean = %v, %v; want [neighbour]", cleaned, err)
		}
		if _, err := os.Stat(n.iso.Path("neighbour")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("cgroup left: %v", err)
		}
		if _, err := n.alloc.Allocation("neighbour"); !errors.Is(err, allocator.ErrUnknownOwner) {
			t.Errorf("GPUs still allocated: %v", err)
		}
		if _, err := os.Stat(filepath.Join(n.dirs.State, "neighbour")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("state directory left: %v", err)
		}
		vols, _ := n.vols.List(ctx)
		for _, v := range vols {
			if slices.Contains(v.Users, "neighbour") {
				t.Errorf("volume %s keeps the neighbour as a user", v.Version)
			}
		}
	})
}

// TestCleanBeforeFirstRecord: a container whose supervisor died after it
// acquired the volume and its GPUs but before its first record loses both.
func TestCleanBeforeFirstRecord(t *testing.T) {
	n := newNode(t, hostVersion())
	ctx := context.Background()
	vol, err := n.vols.Build(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dead := exec.Command("/bin/true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(n.dirs.State, "ghost")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	sup, _ := json.Marshal(allocator.Holder{Pid: dead.Process.Pid, Start: 1})
	if err := os.WriteFile(filepath.Join(dir, "supervisor.json"), sup, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := n.vols.Acquire(ctx, vol.Version, "ghost"); err != nil {
		t.Fatal(err)
	}
	if _, err := n.alloc.Allocate(ctx, "ghost", allocator.Request{Count: 2}); err != nil {
		t.Fatal(err)
	}
	if cleaned, err := n.c.Clean(ctx); err != nil || !slices.Equal(cleaned, []string{"ghost"}) {
		t.Fatalf("Clean = %v, %v; want [ghost]", cleaned, err)
	}
	vols, _ := n.vols.List(ctx)
	for _, v := range vols {
		if slices.Contains(v.Users, "ghost") {
			t.Errorf("volume %s keeps ghost as a user", v.Version)
		}
	}
	if _, err := n.alloc.Allocation("ghost"); !errors.Is(err, allocator.ErrUnknownOwner) {
		t.Errorf("GPUs still allocated: %v", err)
	}
}

func TestCgroupParent(t *testing.T) {
	a, b := native.CgroupParent("/var/lib/a"), native.CgroupParent("/var/lib/b")
	if a == b || a != native.CgroupParent("/var/lib/a/") || filepath.Dir(a) != "gpuiso" {
		t.Fatalf("CgroupParent: %q, %q", a, b)
	}
}

// isSleep tells whether process pid runs sleep.
func isSleep(pid int) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "comm"))
	return err == nil && string(b) == "sleep\n"
}
