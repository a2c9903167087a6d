package containerizer_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
)

// repairingRuntime is a fakeRuntime whose containers are allowed GPUs (as
// a device cgroup allows them) apart from what their records say: it
// resizes them in the order of containerizer.Resize (Updater) and brings
// them in line with the allocator (Repairer), as the native runtime does
// without the kernel.
type repairingRuntime struct {
	*fakeRuntime
	// log gets each resize step.
	log *slog.Logger
	// failCommit fails every record of a resize.
	failCommit error

	amu     sync.Mutex
	allowed map[string][]string // GPU UUIDs by owner
}

func newRepairingRuntime() *repairingRuntime {
	return &repairingRuntime{fakeRuntime: newFakeRuntime(), allowed: map[string][]string{}}
}

func (r *repairingRuntime) allow(id string, gpus []node.DeviceRef) {
	r.amu.Lock()
	defer r.amu.Unlock()
	r.allowed[id] = uuidsOf(gpus)
}

func (r *repairingRuntime) allowedTo(id string) []string {
	r.amu.Lock()
	defer r.amu.Unlock()
	return r.allowed[id]
}

// record makes gpus what the runtime lists for container rid.
func (r *repairingRuntime) record(rid string, gpus []node.DeviceRef) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c, ok := r.ctrs[rid]; ok {
		c.rec.GPUs = slices.Clone(gpus)
	}
}

func (r *repairingRuntime) Create(ctx context.Context, spec containerizer.Spec, p *containerizer.Prepared) (containerizer.Record, error) {
	rec, err := r.fakeRuntime.Create(ctx, spec, p)
	if err == nil {
		r.allow(spec.ID, p.Allocation.Devices)
	}
	return rec, err
}

func (r *repairingRuntime) Remove(ctx context.Context, rec containerizer.Record) error {
	r.amu.Lock()
	delete(r.allowed, rec.ID)
	r.amu.Unlock()
	return r.fakeRuntime.Remove(ctx, rec)
}

func (r *repairingRuntime) Update(ctx context.Context, alloc *allocator.Allocator, rec containerizer.Record, gpus int) (containerizer.Record, error) {
	step := containerizer.Resize{Allocator: alloc, Owner: rec.ID, Logger: r.log,
		Enforce: func(_ context.Context, gpus []node.DeviceRef) error { r.allow(rec.ID, gpus); return nil },
		Commit: func(al allocator.Allocation) error {
			if r.failCommit != nil {
				return r.failCommit
			}
			r.record(rec.RuntimeID, al.Devices)
			return nil
		},
	}
	al, err := step.To(ctx, gpus)
	rec.GPUs = al.Devices
	return rec, err
}

func (r *repairingRuntime) Repair(_ context.Context, alloc *allocator.Allocator, rec containerizer.Record) (containerizer.Record, error) {
	al, err := alloc.Allocation(rec.ID)
	if errors.Is(err, allocator.ErrUnknownOwner) {
		al, err = allocator.Allocation{Owner: rec.ID}, nil
	}
	if err != nil {
		return rec, err
	}
	r.allow(rec.ID, al.Devices)
	r.record(rec.RuntimeID, al.Devices)
	rec.GPUs = al.Devices
	return rec, nil
}

func uuidsOf(refs []node.DeviceRef) []string {
	out := []string{}
	for _, d := range refs {
		out = append(out, d.UUID)
	}
	slices.Sort(out)
	return out
}

// killAt is a log handler that ends the goroutine logging the at-th record
// with a "step" (runtime.Goexit): the process killed there, as far as the
// Lifecycle that ran it can tell; it is never used again.
type killAt struct {
	at    int
	mu    *sync.Mutex
	steps *[]string
}

func newKillAt(at int) killAt { return killAt{at: at, mu: &sync.Mutex{}, steps: new([]string)} }

func (k killAt) Enabled(context.Context, slog.Level) bool { return true }
func (k killAt) WithAttrs([]slog.Attr) slog.Handler       { return k }
func (k killAt) WithGroup(string) slog.Handler            { return k }

func (k killAt) Handle(_ context.Context, r slog.Record) error {
	step := ""
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "step" {
			step = a.Value.String()
		}
		return true
	})
	if step == "" {
		return nil
	}
	k.mu.Lock()
	*k.steps = append(*k.steps, step)
	n := len(*k.steps)
	k.mu.Unlock()
	if n == k.at {
		runtime.Goexit()
	}
	return nil
}

func (k killAt) seen() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(*k.steps)
}

// TestUpdateKillPoints: a Lifecycle killed at any step of a grow or a
// shrink (after each change the step logs) leaves a container that a new
// Lifecycle, over the allocator's state on disk, adopts holding what the
// allocator holds, allowed and recorded exactly that; Destroy then leaves
// nothing.
func TestUpdateKillPoints(t *testing.T) {
	inv, _ := simAllocator(t, "dgx1-volta")
	for _, tc := range []struct {
		name     string
		from, to int
	}{
		{"grow", 1, 3},
		{"grow from none", 0, 2},
		{"shrink", 3, 1},
	} {
		// The steps of an update not killed, then a kill after each.
		all := updateKilled(t, inv, tc.from, tc.to, 0)
		if len(all) == 0 {
			t.Fatalf("%s: an update logs no step", tc.name)
		}
		for at := 1; at <= len(all); at++ {
			t.Run(fmt.Sprintf("%s/killed after %s (%d)", tc.name, all[at-1], at), func(t *testing.T) {
				updateKilled(t, inv, tc.from, tc.to, at)
			})
		}
	}
}

// updateKilled launches a container of from GPUs, updates it to to with
// the Lifecycle killed after the at-th step (none: 0), recovers with a new
// one and checks it; it returns the steps logged.
func updateKilled(t *testing.T, inv *node.Inventory, from, to, at int) []string {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	alloc := newAllocator(t, inv, allocator.WithStateDir(dir))
	rt := newRepairingRuntime()
	k := newKillAt(at)
	rt.log = slog.New(k)
	l := newLifecycle(t, rt, alloc, nil)
	if _, err := l.Launch(ctx, containerizer.Spec{ID: "job", Command: []string{"x"}, GPUs: allocator.Request{Count: from}}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		exited := true
		defer func() {
			if exited {
				done <- errors.New("killed")
			}
		}()
		_, err := l.Update(ctx, "job", to)
		exited = false
		done <- err
	}()
	if err := <-done; at == 0 && err != nil {
		t.Fatalf("update: %v", err)
	}
	rt.log = nil
	// A new process: the allocator's state as on disk, the runtime's
	// containers as they are.
	again := newLifecycle(t, rt, newAllocator(t, inv, allocator.WithStateDir(dir)), nil)
	cs, err := again.Recover(ctx)
	if err != nil {
		t.Fatalf("recover after %v: %v", k.seen(), err)
	}
	if len(cs) != 1 || cs[0].ID != "job" || cs[0].State != containerizer.StateRunning {
		t.Fatalf("recovered %+v", cs)
	}
	held := []string{}
	if al, err := again.Allocator().Allocation("job"); err == nil {
		held = uuidsOf(al.Devices)
	}
	if len(held) != from && len(held) != to {
		t.Errorf("holds %d GPUs, want %d or %d", len(held), from, to)
	}
	recs, _ := rt.List(ctx)
	if got := rt.allowedTo("job"); !slices.Equal(got, held) {
		t.Errorf("allowed %v, holds %v", got, held)
	}
	if len(recs) != 1 || !slices.Equal(uuidsOf(recs[0].GPUs), held) {
		t.Errorf("recorded %+v, holds %v", recs, held)
	}
	if got := uuidsOf(cs[0].GPUs); !slices.Equal(got, held) {
		t.Errorf("adopted with %v, holds %v", got, held)
	}
	if err := again.Destroy(ctx, "job"); err != nil {
		t.Fatal(err)
	}
	if recs, _ := rt.List(ctx); len(recs) != 0 || len(again.Allocator().Allocations()) != 0 {
		t.Errorf("left: %+v, %+v", recs, again.Allocator().Allocations())
	}
	return k.seen()
}

// TestUpdateFollowsAllocator: an update whose record fails after the
// allocator changed returns the container as the allocator holds it, and
// the Lifecycle knows it so.
func TestUpdateFollowsAllocator(t *testing.T) {
	ctx := context.Background()
	_, alloc := simAllocator(t, "dgx1-volta")
	rt := newRepairingRuntime()
	l := newLifecycle(t, rt, alloc, nil)
	if _, err := l.Launch(ctx, containerizer.Spec{ID: "job", Command: []string{"x"}, GPUs: allocator.Request{Count: 3}}); err != nil {
		t.Fatal(err)
	}
	rt.failCommit = errors.New("disk full")
	c, err := l.Update(ctx, "job", 1)
	if err == nil {
		t.Fatal("an update whose record failed succeeded")
	}
	al, aerr := alloc.Allocation("job")
	if aerr != nil || len(al.Devices) != 1 {
		t.Fatalf("holds %+v, %v", al, aerr)
	}
	if !slices.Equal(uuidsOf(c.GPUs), uuidsOf(al.Devices)) || !slices.Equal(uuidsOf(l.Containers()[0].GPUs), uuidsOf(al.Devices)) {
		t.Errorf("returned %+v, knows %+v; holds %+v", c.GPUs, l.Containers()[0].GPUs, al.Devices)
	}
}

// TestNotAdoptedDestroy: a container Recover cannot adopt is reported
// with one kind of node's vocabulary (node.ErrInvalid, through
// ErrNotAdopted), its cause's own errors still matched; Destroy of its id
// removes it and what its owner holds, and a launch of the id then
// succeeds.
func TestNotAdoptedDestroy(t *testing.T) {
	ctx := context.Background()
	_, alloc := simAllocator(t, "dgx1-volta")
	rt := newFakeRuntime()
	l := newLifecycle(t, rt, alloc, nil)
	if _, err := l.Launch(ctx, containerizer.Spec{ID: "owner", Command: []string{"x"}, GPUs: allocator.Request{Count: 1}}); err != nil {
		t.Fatal(err)
	}
	taken := l.Containers()[0].GPUs
	// A second container recorded with the same GPU.
	rt.ctrs["thief"] = &fakeCtr{rec: containerizer.Record{ID: "thief", RuntimeID: "thief", GPUs: taken}, started: true, done: make(chan struct{})}
	again := newLifecycle(t, rt, alloc, nil)
	_, err := again.Recover(ctx)
	if !errors.Is(err, containerizer.ErrNotAdopted) || !errors.Is(err, allocator.ErrDeviceUnavailable) {
		t.Fatalf("recover: %v", err)
	}
	var kinds []string
	for _, k := range []error{node.ErrNotSupported, node.ErrInvalid, node.ErrExists, node.ErrNotFound, node.ErrInsufficient, node.ErrUnavailable, node.ErrCorrupt} {
		if errors.Is(err, k) {
			kinds = append(kinds, k.Error())
		}
	}
	if !slices.Equal(kinds, []string{node.ErrInvalid.Error()}) {
		t.Errorf("recover's error %q matches the kinds %q, want only %q", err, kinds, node.ErrInvalid)
	}
	var na *containerizer.NotAdoptedError
	if !errors.As(err, &na) || na.ID != "thief" || na.Kind != "fake" {
		t.Errorf("recover's error %v: NotAdoptedError %+v", err, na)
	}
	if err := again.Destroy(ctx, "thief"); err != nil {
		t.Fatal(err)
	}
	if rt.get("thief") != nil {
		t.Error("Destroy of the id left its container")
	}
	if _, err := again.Recover(ctx); err != nil {
		t.Errorf("recover after the destroy: %v", err)
	}
}

// TestLifecycleProcRoot: a Lifecycle tells supervisors dead or alive in
// the proc file system its runtime names (native's Config.ProcRoot), and
// refuses a different one of its own.
func TestLifecycleProcRoot(t *testing.T) {
	ctx := context.Background()
	_, alloc := simAllocator(t, "dgx1-volta")
	// A proc file system holding this process alone: the parent, alive in
	// /proc, is dead there.
	procRoot := t.TempDir()
	self := filepath.Join(procRoot, strconv.Itoa(os.Getpid()))
	if err := os.Mkdir(self, 0o755); err != nil {
		t.Fatal(err)
	}
	stat, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(self, "stat"), stat, 0o644); err != nil {
		t.Fatal(err)
	}
	parent, err := allocator.ProcessHolder("", os.Getppid())
	if err != nil {
		t.Fatal(err)
	}
	rt := procRootRuntime{newFakeRuntime(), procRoot}
	free := alloc.Inventory().Devices[0].Ref()
	rt.ctrs["orphan"] = &fakeCtr{rec: containerizer.Record{ID: "orphan", RuntimeID: "orphan", GPUs: []node.DeviceRef{free}, Supervisor: &parent}, started: true, done: make(chan struct{})}
	l := newLifecycle(t, rt, alloc, nil)
	cs, err := l.Recover(ctx)
	if err != nil || len(cs) != 1 || cs[0].ID != "orphan" {
		t.Fatalf("recover: %+v, %v; want the container of a supervisor dead in %s adopted", cs, err, procRoot)
	}
	if _, err := containerizer.NewLifecycle(containerizer.LifecycleConfig{Runtime: rt, Allocator: alloc, ProcRoot: "/proc"}); !errors.Is(err, node.ErrInvalid) {
		t.Errorf("a Lifecycle whose proc root is not its runtime's: %v", err)
	}
}

// procRootRuntime is a fakeRuntime that names its proc file system.
type procRootRuntime struct {
	*fakeRuntime
	proc string
}

func (p procRootRuntime) ProcRoot() string { return p.proc }

// TestLifecycleUsageTempDir: Usage and TempDir reach a runtime that has
// them, and refuse with ErrNotSupported through one that has not.
func TestLifecycleUsageTempDir(t *testing.T) {
	ctx := context.Background()
	_, alloc := simAllocator(t, "dgx1-volta")
	bare := newLifecycle(t, newFakeRuntime(), alloc, nil)
	if _, err := bare.Launch(ctx, containerizer.Spec{ID: "a", Command: []string{"x"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := bare.Usage(ctx, "a"); !errors.Is(err, containerizer.ErrNotSupported) {
		t.Errorf("usage through a runtime without it: %v", err)
	}
	if _, err := bare.TempDir(); !errors.Is(err, containerizer.ErrNotSupported) {
		t.Errorf("a temporary directory through a runtime without them: %v", err)
	}
	dir := t.TempDir()
	rich := newLifecycle(t, richRuntime{newFakeRuntime(), dir}, alloc, nil)
	if _, err := rich.Launch(ctx, containerizer.Spec{ID: "b", Command: []string{"x"}, GPUs: allocator.Request{Count: 2}}); err != nil {
		t.Fatal(err)
	}
	if u, err := rich.Usage(ctx, "b"); err != nil || len(u.GPUs) != 2 {
		t.Errorf("usage: %+v, %v", u, err)
	}
	if _, err := rich.Usage(ctx, "nobody"); !errors.Is(err, containerizer.ErrUnknownContainer) {
		t.Errorf("usage of no container: %v", err)
	}
	if got, err := rich.TempDir(); err != nil || filepath.Dir(got) != dir {
		t.Errorf("temporary directory %q, %v; want one in %s", got, err, dir)
	}
	var zero containerizer.Lifecycle
	if _, err := zero.Usage(ctx, "b"); !errors.Is(err, containerizer.ErrNotMade) {
		t.Errorf("usage through a zero Lifecycle: %v", err)
	}
	if _, err := zero.TempDir(); !errors.Is(err, containerizer.ErrNotMade) {
		t.Errorf("a temporary directory through a zero Lifecycle: %v", err)
	}
}

// richRuntime is a fakeRuntime that reports usage (every GPU of a
// container unused) and makes temporary directories in dir.
type richRuntime struct {
	*fakeRuntime
	dir string
}

func (r richRuntime) Usage(_ context.Context, rec containerizer.Record) (nvmlnode.Usage, error) {
	var u nvmlnode.Usage
	for _, g := range rec.GPUs {
		u.GPUs = append(u.GPUs, nvmlnode.GPUUsage{UUID: g.UUID})
	}
	return u, nil
}

func (r richRuntime) TempDir() (string, error) { return os.MkdirTemp(r.dir, "t-") }
