package native_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/isolator/cgroups"
	"github.com/gpuiso/gpuiso/node"
)

// agentEnv makes the test binary an agent: it opens the node described by
// the variable's JSON, launches containers and waits to be killed.
const agentEnv = "GPUISO_NATIVE_TEST_AGENT"

type agentConfig struct {
	Dirs    dirs
	Version cgroups.Version
	Parent  string
	// Launch maps container ids to shell scripts; each gets 2 GPUs.
	Launch map[string]string
}

func runAgent() int {
	var cfg agentConfig
	if err := json.Unmarshal([]byte(os.Getenv(agentEnv)), &cfg); err != nil {
		fmt.Println("agent:", err)
		return 1
	}
	n, err := open(cfg.Dirs, cfg.Version, cfg.Parent, false)
	if err != nil {
		fmt.Println("agent:", err)
		return 1
	}
	ids := make([]string, 0, len(cfg.Launch))
	for id := range cfg.Launch {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	// An allocation no container stands for, as a crash could leave.
	if _, err := n.alloc.Allocate(context.Background(), "stray", allocator.Request{Count: 1}); err != nil {
		fmt.Println("agent:", err)
		return 1
	}
	for _, id := range ids {
		if _, err := n.c.Launch(context.Background(), containerizer.Spec{ID: id, Command: []string{"/bin/sh", "-c", cfg.Launch[id]}, GPUs: allocator.Request{Count: 2}}); err != nil {
			fmt.Println("agent:", err)
			return 1
		}
	}
	fmt.Println("ready")
	select {} // until SIGKILL
}

// TestRecoverAfterSIGKILL kills the containerizer's process while its
// containers run, starts a new one over the same state and recovers: the
// running containers are re-adopted with their GPUs, the one that exited
// meanwhile is cleaned up, and a new request cannot get the adopted GPUs.
func TestRecoverAfterSIGKILL(t *testing.T) {
	versions(t, func(t *testing.T, n *testNode) {
		ctx := context.Background()
		agent := startAgent(t, n, map[string]string{"long-a": "sleep 1000", "long-b": "sleep 1000", "short": "sleep 0.3"})
		if err := agent.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		agent.Wait()
		// "short" exits while no containerizer runs; its init records that.
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if _, err := os.Stat(filepath.Join(n.dirs.State, "short", "exit.json")); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the short container never exited")
			}
		}

		// A fresh containerizer over the same state, as after a restart.
		if n.c = mustOpen(t, n).c; n.c == nil {
			t.Fatal("no containerizer")
		}
		re, err := n.c.Recover(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		held := map[string]bool{}
		for _, ct := range re {
			ids = append(ids, ct.ID)
			if len(ct.GPUs) != 2 || ct.State != containerizer.StateRunning {
				t.Errorf("re-adopted %+v", ct)
			}
			for _, g := range ct.GPUs {
				held[g.UUID] = true
			}
			if pids, _ := n.iso.Processes(ctx, ct.ID); !slices.Contains(pids, ct.Pid) {
				t.Errorf("%s: init %d not in its cgroup %v", ct.ID, ct.Pid, pids)
			}
		}
		slices.Sort(ids)
		if !slices.Equal(ids, []string{"long-a", "long-b"}) {
			t.Fatalf("re-adopted %v, want long-a and long-b", ids)
		}
		for _, gone := range []string{"short", "stray"} {
			if _, err := n.alloc.Allocation(gone); !errors.Is(err, allocator.ErrUnknownOwner) {
				t.Errorf("%s's GPUs are still allocated: %v", gone, err)
			}
		}
		if _, err := os.Stat(n.iso.Path("short")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the exited container's cgroup is left: %v", err)
		}
		if _, err := n.c.Launch(ctx, containerizer.Spec{ID: "greedy", Command: []string{"/bin/true"}, GPUs: allocator.Request{Count: 5}}); !errors.Is(err, node.ErrInsufficient) {
			t.Fatalf("5 GPUs with 4 re-adopted = %v, want ErrInsufficient", err)
		}
		if _, err := os.Stat(filepath.Join(n.dirs.State, "greedy")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("a refused launch left its state directory: %v", err)
		}
		ct, err := n.c.Launch(ctx, containerizer.Spec{ID: "rest", Command: []string{"/bin/sleep", "1000"}, GPUs: allocator.Request{Count: 4}})
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range ct.GPUs {
			if held[g.UUID] {
				t.Fatalf("GPU %d handed out twice", g.Index)
			}
		}
		// An adopted container is still fully managed.
		if err := n.c.Destroy(ctx, "long-a"); err != nil {
			t.Fatal(err)
		}
		if st, err := n.c.Wait(ctx, "long-a"); err == nil {
			t.Fatalf("Wait on a destroyed container = %+v", st)
		}
	})
}

func mustOpen(t *testing.T, n *testNode) *testNode {
	t.Helper()
	fresh, err := open(n.dirs, n.version, n.parentCG, false)
	if err != nil {
		t.Fatal(err)
	}
	n.alloc, n.inv, n.iso, n.vols = fresh.alloc, fresh.inv, fresh.iso, fresh.vols
	return fresh
}
