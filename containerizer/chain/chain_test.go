package chain

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
	"github.com/gpuiso/gpuiso/volume"
)

// fakeDevices records the rules and processes of each cgroup.
type fakeDevices struct {
	mu    sync.Mutex
	rules map[string][]isolator.Rule
	procs map[string][]int
}

func newFakeDevices() *fakeDevices {
	return &fakeDevices{rules: map[string][]isolator.Rule{}, procs: map[string][]int{}}
}

func (f *fakeDevices) Apply(_ context.Context, parent, name string, rules []isolator.Rule) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rules[parent+"/"+name] = isolator.Canonical(rules)
	return nil
}

func (f *fakeDevices) AddProcess(_ context.Context, parent, name string, pid int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.rules[parent+"/"+name]; !ok {
		return isolator.ErrUnknownContainer
	}
	f.procs[parent+"/"+name] = append(f.procs[parent+"/"+name], pid)
	return nil
}

func (f *fakeDevices) Processes(_ context.Context, parent, name string) ([]int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.rules[parent+"/"+name]; !ok {
		return nil, isolator.ErrUnknownContainer
	}
	return slices.Clone(f.procs[parent+"/"+name]), nil
}

func (f *fakeDevices) Destroy(_ context.Context, parent, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.rules, parent+"/"+name)
	delete(f.procs, parent+"/"+name)
	return nil
}

func (f *fakeDevices) Owners(_ context.Context, parent string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for k := range f.rules {
		if filepath.Dir(k) == parent {
			out = append(out, filepath.Base(k))
		}
	}
	slices.Sort(out)
	return out, nil
}

func (f *fakeDevices) RemoveParent(string) error { return nil }

// allows reports whether cgroup key allows GPU g's node.
func (f *fakeDevices) allows(key string, g node.DeviceRef) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Contains(f.rules[key], isolator.Allow(int64(g.Node.Major), int64(g.Node.Minor), "rwm"))
}

const parent = "gpuiso/atest"

// fixture is an isolator over a fake device cgroup, with its allocator's
// and its own state in directories of t.
type fixture struct {
	inv      *node.Inventory
	allocDir string
	dir      string
	dev      *fakeDevices
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	sim, err := simnode.New("dgx1-volta")
	if err != nil {
		t.Fatal(err)
	}
	inv, err := nvmlnode.Discover(context.Background(), nvmlnode.WithNVML(sim.NVML()))
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{inv: inv, allocDir: t.TempDir(), dir: t.TempDir(), dev: newFakeDevices()}
}

// open makes an isolator (and its allocator) on the fixture's state, as a
// restarted agent does.
func (f *fixture) open(t *testing.T) (*Isolator, *allocator.Allocator) {
	t.Helper()
	a, err := allocator.New(f.inv, allocator.WithStateDir(f.allocDir))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return newIsolator(Config{Allocator: a, Inventory: f.inv, StateDir: f.dir}, f.dir, parent, f.dev), a
}

func TestHooks(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	iso, a := f.open(t)
	l, err := iso.Prepare(ctx, "c1", allocator.Request{Count: 2}, containerizer.Image{})
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Allocation.Devices) != 2 || len(l.Plan.Devices) < 2 || !slices.ContainsFunc(l.Plan.Env, func(e string) bool {
		return e == "NVIDIA_VISIBLE_DEVICES="+l.Allocation.Devices[0].UUID+","+l.Allocation.Devices[1].UUID
	}) {
		t.Fatalf("launch: %+v, plan %+v", l.Allocation, l.Plan)
	}
	if _, err := iso.Prepare(ctx, "c1", allocator.Request{Count: 1}, containerizer.Image{}); !errors.Is(err, ErrContainerExists) {
		t.Fatalf("second Prepare: %v, want ErrContainerExists", err)
	}
	if err := iso.Isolate(ctx, "c1", 4242); err != nil {
		t.Fatal(err)
	}
	key := parent + "/c1"
	for _, g := range l.Allocation.Devices {
		if !f.dev.allows(key, g) {
			t.Errorf("GPU %d not allowed after Isolate", g.Index)
		}
	}
	if pids, _ := f.dev.Processes(ctx, parent, "c1"); !slices.Equal(pids, []int{4242}) {
		t.Errorf("processes %v, want [4242]", pids)
	}

	// Shrink: the GPU that goes is denied and freed.
	al, err := iso.Update(ctx, "c1", 1)
	if err != nil {
		t.Fatal(err)
	}
	gone := l.Allocation.Devices[0]
	if al.Devices[0].UUID == gone.UUID {
		gone = l.Allocation.Devices[1]
	}
	if f.dev.allows(key, gone) || !f.dev.allows(key, al.Devices[0]) {
		t.Errorf("after shrink: kept %s allowed %v, gone %s allowed %v", al.Devices[0].UUID, f.dev.allows(key, al.Devices[0]), gone.UUID, f.dev.allows(key, gone))
	}
	if owners, _ := a.Owners(gone.UUID); len(owners) != 0 {
		t.Errorf("GPU that went still held by %v", owners)
	}
	// Grow back to 3.
	if al, err = iso.Update(ctx, "c1", 3); err != nil || len(al.Devices) != 3 {
		t.Fatalf("grow: %v %v", al, err)
	}
	for _, g := range al.Devices {
		if !f.dev.allows(key, g) {
			t.Errorf("GPU %d not allowed after grow", g.Index)
		}
	}
	if _, err := iso.Usage(ctx, "c1"); !errors.Is(err, node.ErrNotSupported) {
		t.Errorf("Usage without NVML: %v, want ErrNotSupported", err)
	}

	for range 2 { // idempotent
		if err := iso.Cleanup(ctx, "c1"); err != nil {
			t.Fatal(err)
		}
	}
	if len(a.Allocations()) != 0 {
		t.Errorf("allocations left: %v", a.Allocations())
	}
	if ids, _ := iso.ids(); len(ids) != 0 {
		t.Errorf("records left: %v", ids)
	}
	if owners, _ := f.dev.Owners(ctx, parent); len(owners) != 0 {
		t.Errorf("cgroups left: %v", owners)
	}
}

func TestIsolateCgroup(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	iso, a := f.open(t)
	l, err := iso.Prepare(ctx, "c1", allocator.Request{Count: 1}, containerizer.Image{})
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"", "c1", "/agent/c1", "agent/../c1", "agent/c 1"} {
		if err := iso.IsolateCgroup(ctx, "c1", bad); !errors.Is(err, ErrInvalidCgroup) {
			t.Errorf("IsolateCgroup(%q): %v, want ErrInvalidCgroup", bad, err)
		}
	}
	if err := iso.IsolateCgroup(ctx, "c1", "agent/ct-1"); err != nil {
		t.Fatal(err)
	}
	if !f.dev.allows("agent/ct-1", l.Allocation.Devices[0]) {
		t.Fatal("agent's cgroup does not allow the container's GPU")
	}
	f.dev.AddProcess(ctx, "agent", "ct-1", 99)
	if err := iso.Cleanup(ctx, "c1"); !errors.Is(err, ErrStillRunning) {
		t.Fatalf("Cleanup with processes in the agent's cgroup: %v, want ErrStillRunning", err)
	}
	if len(a.Allocations()) != 1 {
		t.Fatal("a refused Cleanup released the allocation")
	}
	// The agent removes its cgroup; the isolator leaves it to the agent.
	f.dev.Destroy(ctx, "agent", "ct-1")
	if err := iso.Cleanup(ctx, "c1"); err != nil {
		t.Fatal(err)
	}
	if len(a.Allocations()) != 0 {
		t.Errorf("allocations left: %v", a.Allocations())
	}
}

func TestPrepareRefusals(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	iso, a := f.open(t)
	for _, tc := range []struct {
		name string
		id   string
		req  allocator.Request
		img  containerizer.Image
		want error
	}{
		{"bad id", "a/b", allocator.Request{Count: 1}, containerizer.Image{}, node.ErrInvalid},
		{"more than the node has", "c1", allocator.Request{Count: 9}, containerizer.Image{}, allocator.ErrInvalidRequest},
		{"unknown device", "c1", allocator.Request{Devices: []string{"GPU-nope"}}, containerizer.Image{}, node.ErrNotFound},
		{"volume and no volume manager", "c1", allocator.Request{Count: 1},
			containerizer.Image{OwnRoot: true, Env: []string{"NVIDIA_VISIBLE_DEVICES=all"}}, containerizer.ErrNoVolume},
		{"driver too old for the image", "c1", allocator.Request{Count: 1},
			containerizer.Image{Env: []string{"NVIDIA_REQUIRE_CUDA=cuda>=99.0"}}, volume.ErrRequirementUnmet},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := iso.Prepare(ctx, tc.id, tc.req, tc.img); !errors.Is(err, tc.want) {
				t.Fatalf("Prepare: %v, want %v", err, tc.want)
			}
			if len(a.Allocations()) != 0 {
				t.Errorf("allocations after a refusal: %v", a.Allocations())
			}
			if ids, _ := iso.ids(); len(ids) != 0 {
				t.Errorf("records after a refusal: %v", ids)
			}
		})
	}
	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"Isolate", func() error { return iso.Isolate(ctx, "c9", 1) }},
		{"IsolateCgroup", func() error { return iso.IsolateCgroup(ctx, "c9", "agent/c9") }},
		{"Update", func() error { _, err := iso.Update(ctx, "c9", 1); return err }},
		{"Usage", func() error { _, err := iso.Usage(ctx, "c9"); return err }},
	} {
		if err := tc.call(); !errors.Is(err, ErrUnknownContainer) {
			t.Errorf("%s before Prepare: %v, want ErrUnknownContainer", tc.name, err)
		}
	}
	if err := iso.Cleanup(ctx, "c9"); err != nil {
		t.Errorf("Cleanup of a container never prepared: %v", err)
	}
	var zero Isolator
	if _, err := zero.Prepare(ctx, "c1", allocator.Request{}, containerizer.Image{}); !errors.Is(err, ErrNotMade) {
		t.Errorf("zero Isolator: %v, want ErrNotMade", err)
	}
}

// TestRecover restarts the isolator over the same state, as an agent
// killed with its containers running would be, in each state a kill can
// leave behind.
func TestRecover(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		// lose drops the allocator's state before the restart.
		lose bool
	}{
		{"allocations kept", false},
		{"allocator state lost", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			iso, a := f.open(t)
			var launches []*Launch
			for _, id := range []string{"keep", "gone"} {
				l, err := iso.Prepare(ctx, id, allocator.Request{Count: 2}, containerizer.Image{})
				if err != nil {
					t.Fatal(err)
				}
				if err := iso.Isolate(ctx, id, 100); err != nil {
					t.Fatal(err)
				}
				launches = append(launches, l)
			}
			// A Prepare cut short: its record says preparing.
			if err := iso.write(held{ID: "half", Phase: phasePreparing}); err != nil {
				t.Fatal(err)
			}
			if _, err := a.Allocate(ctx, "half", allocator.Request{Count: 1}); err != nil {
				t.Fatal(err)
			}
			// A record that cannot be read, with an allocation.
			if err := os.WriteFile(filepath.Join(f.dir, "bad.json"), []byte("{"), 0o600); err != nil {
				t.Fatal(err)
			}
			if _, err := a.Allocate(ctx, "bad", allocator.Request{Count: 1}); err != nil {
				t.Fatal(err)
			}
			// A device cgroup without a record (a kill between cleanups).
			f.dev.Apply(ctx, parent, "stray", nil)
			// A device cgroup of a container the agent knows, without a
			// record: it stays, with every GPU denied.
			f.dev.Apply(ctx, parent, "never", isolator.GPURules(nil, []node.DeviceRef{{UUID: f.inv.Devices[0].UUID, Node: f.inv.Devices[0].Node}}))
			// Rules the kernel lost (reapplied by Recover).
			f.dev.Apply(ctx, parent, "keep", isolator.DefaultRules())
			a.Close()
			if tc.lose {
				if err := os.RemoveAll(f.allocDir); err != nil {
					t.Fatal(err)
				}
				os.Mkdir(f.allocDir, 0o700)
			}

			iso, a = f.open(t)
			res, err := iso.Recover(ctx, []string{"keep", "never"})
			if err != nil {
				t.Fatal(err)
			}
			want := Recovered{Recovered: []string{"keep"}, Cleaned: []string{"bad", "gone", "half", "stray"}, Unknown: []string{"never"}}
			if fmt.Sprint(res) != fmt.Sprint(want) {
				t.Errorf("Recover = %+v, want %+v", res, want)
			}
			al, err := a.Allocation("keep")
			if err != nil || !slices.Equal(uuids(al.Devices), uuids(launches[0].Allocation.Devices)) {
				t.Errorf("keep holds %v (%v), want %v", uuids(al.Devices), err, uuids(launches[0].Allocation.Devices))
			}
			if got := a.Allocations(); len(got) != 1 {
				t.Errorf("allocations after Recover: %v", got)
			}
			for _, g := range launches[0].Allocation.Devices {
				if !f.dev.allows(parent+"/keep", g) {
					t.Errorf("GPU %d of keep not allowed again", g.Index)
				}
			}
			if owners, _ := f.dev.Owners(ctx, parent); !slices.Equal(owners, []string{"keep", "never"}) {
				t.Errorf("cgroups after Recover: %v", owners)
			}
			for _, g := range f.inv.Devices {
				if f.dev.allows(parent+"/never", node.DeviceRef{Node: g.Node}) {
					t.Errorf("GPU %d still allowed to a container the isolator holds nothing for", g.Index)
				}
			}
		})
	}
}

// TestStateDirLock: one isolator at a time holds a state directory.
func TestStateDirLock(t *testing.T) {
	dir := t.TempDir()
	first, err := lockDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lockDir(dir); !errors.Is(err, ErrInUse) {
		t.Fatalf("second lock: %v, want ErrInUse", err)
	}
	first.Close()
	second, err := lockDir(dir)
	if err != nil {
		t.Fatalf("lock after the first gave it up: %v", err)
	}
	second.Close()
}

// TestRecoverTakenGPUs: a known container whose GPUs another owner took
// while the allocator's state was lost is not recovered: it keeps running
// with every GPU denied, and the other owner keeps them.
func TestRecoverTakenGPUs(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	iso, a := f.open(t)
	l, err := iso.Prepare(ctx, "c1", allocator.Request{Count: 1}, containerizer.Image{})
	if err != nil {
		t.Fatal(err)
	}
	if err := iso.Isolate(ctx, "c1", 100); err != nil {
		t.Fatal(err)
	}
	a.Close()
	if err := os.RemoveAll(f.allocDir); err != nil {
		t.Fatal(err)
	}
	os.Mkdir(f.allocDir, 0o700)
	iso, a = f.open(t)
	if _, err := a.Allocate(ctx, "thief", allocator.Request{Devices: uuids(l.Allocation.Devices)}); err != nil {
		t.Fatal(err)
	}
	res, err := iso.Recover(ctx, []string{"c1"})
	if err == nil || len(res.Recovered)+len(res.Cleaned) != 0 {
		t.Fatalf("Recover = %+v, %v: want an error and nothing recovered or cleaned", res, err)
	}
	if f.dev.allows(parent+"/c1", l.Allocation.Devices[0]) {
		t.Error("c1 still allowed the GPU another owner holds")
	}
	if owners, _ := f.dev.Owners(ctx, parent); !slices.Equal(owners, []string{"c1"}) {
		t.Errorf("cgroups after Recover: %v, want c1's kept", owners)
	}
	if owners, _ := a.Owners(l.Allocation.Devices[0].UUID); !slices.Equal(owners, []string{"thief"}) {
		t.Errorf("GPU owners %v, want [thief]", owners)
	}
}

// TestUsage reads a container's usage through NVML (the simulated node's)
// for exactly the GPUs it holds.
func TestUsage(t *testing.T) {
	ctx := context.Background()
	sim, err := simnode.New("dgx1-volta")
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t)
	a, err := allocator.New(f.inv)
	if err != nil {
		t.Fatal(err)
	}
	iso := newIsolator(Config{Allocator: a, Inventory: f.inv, StateDir: f.dir, NVML: sim.NVML()}, f.dir, parent, f.dev)
	l, err := iso.Prepare(ctx, "c1", allocator.Request{Count: 2}, containerizer.Image{})
	if err != nil {
		t.Fatal(err)
	}
	if err := iso.Isolate(ctx, "c1", 4242); err != nil {
		t.Fatal(err)
	}
	u, err := iso.Usage(ctx, "c1")
	if err != nil && !errors.Is(err, node.ErrNotSupported) {
		t.Fatal(err)
	}
	var got []string
	for _, g := range u.GPUs {
		got = append(got, g.UUID)
	}
	if !slices.Equal(got, uuids(l.Allocation.Devices)) {
		t.Errorf("usage of GPUs %v, want %v", got, uuids(l.Allocation.Devices))
	}
}
