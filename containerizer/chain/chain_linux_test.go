package chain

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/isolator/cgroups"
	"github.com/gpuiso/gpuiso/node"
)

func TestMain(m *testing.M) { testenv.MainCheckingLeaks(m) }

// TestIsolateProcess runs a real process isolated by the isolator on a
// simulated node, for each cgroup version: it may open its GPUs' nodes and
// no other GPU's, through an update; a restarted isolator recovers it; a
// second instance's Recover leaves it alone; a Recover that no longer knows
// it kills it and frees everything.
func TestIsolateProcess(t *testing.T) {
	for _, tc := range []struct {
		version cgroups.Version
		require func(testing.TB) string
	}{
		{cgroups.V1, testenv.RequireCgroupV1Devices},
		{cgroups.V2, testenv.RequireCgroupV2},
	} {
		t.Run(tc.version.String(), func(t *testing.T) {
			mount := tc.require(t)
			ctx := context.Background()
			_, _, inv := testenv.SimulatedNode(t, "dgx1-volta")
			allocDir := t.TempDir()
			open := func(stateDir string) (*Isolator, *allocator.Allocator) {
				t.Helper()
				a, err := allocator.New(inv, allocator.WithStateDir(allocDir))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { a.Close() })
				cg, err := cgroups.New(cgroups.WithVersion(tc.version), cgroups.WithMount(mount))
				if err != nil {
					t.Fatal(err)
				}
				iso, err := New(Config{Allocator: a, Inventory: inv, StateDir: stateDir, Cgroups: cg})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { iso.Close() })
				return iso, a
			}
			stateDir := t.TempDir()
			iso, _ := open(stateDir)
			t.Cleanup(func() { iso.Cleanup(context.Background(), "c1") })
			if _, err := New(Config{Allocator: iso.alloc, Inventory: inv, StateDir: stateDir}); !errors.Is(err, ErrInUse) {
				t.Fatalf("a second isolator on the state directory: %v, want ErrInUse", err)
			}
			l, err := iso.Prepare(ctx, "c1", allocator.Request{Count: 1}, containerizer.Image{})
			if err != nil {
				t.Fatal(err)
			}
			p := testenv.StartProber(t, func(pid int) error { return iso.Isolate(ctx, "c1", pid) })
			check := func(when string, held []node.DeviceRef) {
				t.Helper()
				for _, d := range inv.Devices {
					got, err := p.Open(d.Node.Path)
					if err != nil {
						t.Fatalf("%s: %v", when, err)
					}
					mine := slices.ContainsFunc(held, func(r node.DeviceRef) bool { return r.UUID == d.UUID })
					if testenv.Allowed(got) != mine || !mine && got != "EPERM" {
						t.Errorf("%s: GPU %d (held %v): open %s", when, d.Index, mine, got)
					}
				}
			}
			check("after Isolate", l.Allocation.Devices)
			al, err := iso.Update(ctx, "c1", 2)
			if err != nil {
				t.Fatal(err)
			}
			check("after a grow to 2", al.Devices)
			if al, err = iso.Update(ctx, "c1", 1); err != nil {
				t.Fatal(err)
			}
			check("after a shrink to 1", al.Devices)

			// A neighbour instance with its own state directory recovers
			// with nothing known: c1 is not its own.
			other, _ := open(t.TempDir())
			if res, err := other.Recover(ctx, nil); err != nil || len(res.Cleaned) != 0 {
				t.Fatalf("neighbour's Recover: %+v, %v", res, err)
			}
			check("after a neighbour's Recover", al.Devices)

			// The agent restarts and still knows c1.
			iso.Close()
			if err := iso.Isolate(ctx, "c1", p.Pid); !errors.Is(err, ErrClosed) {
				t.Errorf("Isolate after Close: %v, want ErrClosed", err)
			}
			iso, a := open(stateDir)
			res, err := iso.Recover(ctx, []string{"c1"})
			if err != nil || !slices.Equal(res.Recovered, []string{"c1"}) {
				t.Fatalf("Recover: %+v, %v", res, err)
			}
			if got, err := a.Allocation("c1"); err != nil || got.Devices[0].UUID != al.Devices[0].UUID {
				t.Fatalf("after Recover c1 holds %+v (%v), want %s", got.Devices, err, al.Devices[0].UUID)
			}
			check("after Recover", al.Devices)

			// It restarts again and no longer knows c1: everything goes.
			iso.Close()
			iso, a = open(stateDir)
			if res, err = iso.Recover(ctx, nil); err != nil || !slices.Equal(res.Cleaned, []string{"c1"}) {
				t.Fatalf("Recover of nothing: %+v, %v", res, err)
			}
			if _, err := p.Open(inv.Devices[0].Node.Path); err == nil {
				t.Error("the prober survived the clean-up of its container")
			}
			if len(a.Allocations()) != 0 {
				t.Errorf("allocations left: %v", a.Allocations())
			}
			if _, err := os.Stat(filepath.Join(mount, iso.Parent())); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("cgroup parent %s left: %v", iso.Parent(), err)
			}
		})
	}
}

// TestIsolateAgentCgroup enforces a container's rules on a cgroup the
// agent made (as an agent with its own CPU and memory cgroup on cgroup2
// does), for each cgroup version: the process in it may open its GPU and
// no other; Cleanup refuses while the cgroup holds it and leaves the
// cgroup to the agent.
func TestIsolateAgentCgroup(t *testing.T) {
	for _, tc := range []struct {
		version cgroups.Version
		require func(testing.TB) string
	}{
		{cgroups.V1, testenv.RequireCgroupV1Devices},
		{cgroups.V2, testenv.RequireCgroupV2},
	} {
		t.Run(tc.version.String(), func(t *testing.T) {
			mount := tc.require(t)
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
			iso, err := New(Config{Allocator: a, Inventory: inv, StateDir: t.TempDir(), Cgroups: cg})
			if err != nil {
				t.Fatal(err)
			}
			defer iso.Close()
			// The agent's cgroup, and the agent's own way to remove it.
			agentParent := "chain-test-" + filepath.Base(t.TempDir())
			agentCg, err := cg.InParent(agentParent)
			if err != nil {
				t.Fatal(err)
			}
			dir := filepath.Join(mount, agentParent, "c2")
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				agentCg.Destroy(context.Background(), "c2")
				agentCg.RemoveParent()
			})

			l, err := iso.Prepare(ctx, "c2", allocator.Request{Count: 1}, containerizer.Image{})
			if err != nil {
				t.Fatal(err)
			}
			if err := iso.IsolateCgroup(ctx, "c2", agentParent+"/c2"); err != nil {
				t.Fatal(err)
			}
			p := testenv.StartProber(t, func(pid int) error { return agentCg.AddProcess(ctx, "c2", pid) })
			for _, d := range inv.Devices {
				got, err := p.Open(d.Node.Path)
				if err != nil {
					t.Fatal(err)
				}
				mine := d.UUID == l.Allocation.Devices[0].UUID
				if testenv.Allowed(got) != mine || !mine && got != "EPERM" {
					t.Errorf("GPU %d (held %v): open %s", d.Index, mine, got)
				}
			}
			if err := iso.Cleanup(ctx, "c2"); !errors.Is(err, ErrStillRunning) {
				t.Fatalf("Cleanup with the container running: %v, want ErrStillRunning", err)
			}
			if len(a.Allocations()) != 1 {
				t.Fatal("a refused Cleanup released the GPU")
			}
			if err := agentCg.Destroy(ctx, "c2"); err != nil {
				t.Fatal(err)
			}
			if err := iso.Cleanup(ctx, "c2"); err != nil {
				t.Fatal(err)
			}
			if len(a.Allocations()) != 0 {
				t.Errorf("allocations left: %v", a.Allocations())
			}
		})
	}
}
