package containerizer_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/node"
)

// fakeRuntime runs nothing: it keeps records, and a container's command
// ends when the test says (end) or when it is killed.
type fakeRuntime struct {
	// kind is its Kind ("fake" when empty).
	kind containerizer.Kind
	// failList, when set, is what List returns.
	failList error
	// gate, when set, holds every Create until it is closed; entered is
	// told when a Create reaches it.
	gate, entered chan struct{}
	failStart     error

	mu   sync.Mutex
	ctrs map[string]*fakeCtr // by runtime id
	next int
}

type fakeCtr struct {
	rec     containerizer.Record
	started bool
	exit    *containerizer.ExitStatus
	done    chan struct{}
}

func newFakeRuntime() *fakeRuntime { return &fakeRuntime{ctrs: map[string]*fakeCtr{}} }

func (f *fakeRuntime) Kind() containerizer.Kind {
	if f.kind == "" {
		return "fake"
	}
	return f.kind
}

func (f *fakeRuntime) Image(_ context.Context, spec containerizer.Spec) (containerizer.Image, error) {
	if len(spec.Command) == 0 {
		return containerizer.Image{}, fmt.Errorf("%w: no command", containerizer.ErrInvalidSpec)
	}
	return containerizer.Image{}, nil
}

func (f *fakeRuntime) Create(_ context.Context, spec containerizer.Spec, p *containerizer.Prepared) (containerizer.Record, error) {
	if f.gate != nil {
		f.entered <- struct{}{}
		<-f.gate
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.next++
	rec := containerizer.Record{ID: spec.ID, RuntimeID: fmt.Sprintf("rt-%d", f.next)}
	f.ctrs[rec.RuntimeID] = &fakeCtr{rec: rec, done: make(chan struct{})}
	return rec, nil
}

func (f *fakeRuntime) Start(_ context.Context, rec containerizer.Record) error {
	if f.failStart != nil {
		return f.failStart
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.ctrs[rec.RuntimeID]
	if !ok {
		return errors.New("no such container")
	}
	c.rec, c.started = rec, true // what the lifecycle recorded: the labels
	return nil
}

func (f *fakeRuntime) get(id string) *fakeCtr {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ctrs[id]
}

// end makes the command of the container of owner id end with code.
func (f *fakeRuntime) end(id string, code int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.ctrs {
		if c.rec.ID == id && c.exit == nil {
			c.exit = &containerizer.ExitStatus{Code: code}
			close(c.done)
		}
	}
}

func (f *fakeRuntime) Wait(ctx context.Context, rec containerizer.Record) (containerizer.ExitStatus, error) {
	c := f.get(rec.RuntimeID)
	if c == nil {
		return containerizer.ExitStatus{}, errors.New("no such container")
	}
	select {
	case <-c.done:
		f.mu.Lock()
		defer f.mu.Unlock()
		return *c.exit, nil
	case <-ctx.Done():
		return containerizer.ExitStatus{}, ctx.Err()
	}
}

func (f *fakeRuntime) Kill(_ context.Context, rec containerizer.Record) error {
	if c := f.get(rec.RuntimeID); c != nil {
		f.end(c.rec.ID, 137)
	}
	return nil
}

func (f *fakeRuntime) Remove(_ context.Context, rec containerizer.Record) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.ctrs, rec.RuntimeID)
	return nil
}

func (f *fakeRuntime) List(context.Context) ([]containerizer.Record, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failList != nil {
		return nil, f.failList
	}
	var out []containerizer.Record
	for _, c := range f.ctrs {
		r := c.rec
		if c.exit != nil {
			e := *c.exit
			r.Exit = &e
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b containerizer.Record) int { return cmpString(a.RuntimeID, b.RuntimeID) })
	return out, nil
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func newLifecycle(t *testing.T, rt containerizer.Runtime, alloc *allocator.Allocator, mod func(*containerizer.LifecycleConfig)) *containerizer.Lifecycle {
	t.Helper()
	cfg := containerizer.LifecycleConfig{Runtime: rt, Allocator: alloc}
	if mod != nil {
		mod(&cfg)
	}
	l, err := containerizer.NewLifecycle(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestLifecycle: launch, wait, destroy through a runtime; a launch that
// fails leaves nothing; states as the table says.
func TestLifecycle(t *testing.T) {
	ctx := context.Background()
	_, alloc := simAllocator(t, "dgx1-volta")
	rt := newFakeRuntime()
	l := newLifecycle(t, rt, alloc, nil)

	c, err := l.Launch(ctx, containerizer.Spec{ID: "a", Command: []string{"x"}, GPUs: allocator.Request{Count: 2}})
	if err != nil {
		t.Fatal(err)
	}
	if c.State != containerizer.StateRunning || c.Kind != "fake" || len(c.GPUs) != 2 || c.RuntimeID == "" {
		t.Fatalf("launched %+v", c)
	}
	if got := rt.get(c.RuntimeID); got == nil || !got.started || len(got.rec.GPUs) != 2 {
		t.Fatalf("the runtime's container: %+v", got)
	}
	if _, err := l.Launch(ctx, containerizer.Spec{ID: "a", Command: []string{"x"}}); !errors.Is(err, containerizer.ErrContainerExists) {
		t.Fatalf("a second launch of a: %v", err)
	}
	rt.end("a", 3)
	if st, err := l.Wait(ctx, "a"); err != nil || st.Code != 3 {
		t.Fatalf("wait: %+v, %v", st, err)
	}
	if cs := l.Containers(); len(cs) != 1 || cs[0].State != containerizer.StateExited {
		t.Fatalf("after its exit: %+v", cs)
	}
	if _, err := l.Update(ctx, "a", 1); !errors.Is(err, containerizer.ErrNotSupported) {
		t.Fatalf("update through a runtime without Updater: %v", err)
	}
	if err := l.Destroy(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if rt.get(c.RuntimeID) != nil || len(alloc.Allocations()) != 0 || len(l.Containers()) != 0 {
		t.Fatalf("left after destroy: %v, %+v, %+v", rt.get(c.RuntimeID), alloc.Allocations(), l.Containers())
	}
	if err := l.Destroy(ctx, "a"); err != nil {
		t.Fatalf("destroy of a destroyed container: %v", err)
	}
	if err := l.Destroy(ctx, "../a"); !errors.Is(err, containerizer.ErrInvalidSpec) {
		t.Fatalf("destroy of an id no container can have: %v", err)
	}

	refused := []struct {
		name string
		spec containerizer.Spec
		want error
	}{
		{"bad id", containerizer.Spec{ID: "../a", Command: []string{"x"}}, containerizer.ErrInvalidSpec},
		{"runtime refuses the spec", containerizer.Spec{ID: "b"}, containerizer.ErrInvalidSpec},
		{"too many gpus", containerizer.Spec{ID: "b", Command: []string{"x"}, GPUs: allocator.Request{Count: 9}}, allocator.ErrInvalidRequest},
		{"start fails", containerizer.Spec{ID: "b", Command: []string{"x"}, GPUs: allocator.Request{Count: 1}}, os.ErrPermission},
	}
	for _, tc := range refused {
		t.Run(tc.name, func(t *testing.T) {
			if tc.want == os.ErrPermission {
				rt.failStart = fmt.Errorf("start: %w", os.ErrPermission)
				defer func() { rt.failStart = nil }()
			}
			if _, err := l.Launch(ctx, tc.spec); !errors.Is(err, tc.want) {
				t.Fatalf("launch: %v, want %v", err, tc.want)
			}
			recs, _ := rt.List(ctx)
			if len(recs) != 0 || len(alloc.Allocations()) != 0 || len(l.Containers()) != 0 {
				t.Fatalf("left after a refused launch: %+v, %+v, %+v", recs, alloc.Allocations(), l.Containers())
			}
		})
	}
	if _, err := l.Launch(ctx, containerizer.Spec{ID: "b", Command: []string{"x"}}); err != nil {
		t.Fatalf("the id of failed launches, again: %v", err)
	}
}

// TestLifecycleDestroyDuringLaunch: a Destroy during a launch waits for it
// and then destroys the container. Run with -race.
func TestLifecycleDestroyDuringLaunch(t *testing.T) {
	ctx := context.Background()
	_, alloc := simAllocator(t, "dgx1-volta")
	rt := newFakeRuntime()
	rt.gate, rt.entered = make(chan struct{}), make(chan struct{}, 1)
	l := newLifecycle(t, rt, alloc, nil)
	launched := make(chan error, 1)
	go func() {
		_, err := l.Launch(ctx, containerizer.Spec{ID: "a", Command: []string{"x"}, GPUs: allocator.Request{Count: 2}})
		launched <- err
	}()
	<-rt.entered
	destroyed := make(chan error, 1)
	go func() { destroyed <- l.Destroy(ctx, "a") }()
	if _, err := l.Wait(ctx, "a"); !errors.Is(err, containerizer.ErrUnknownContainer) {
		t.Fatalf("wait for a launching container: %v", err)
	}
	close(rt.gate)
	if err := <-launched; err != nil {
		t.Fatal(err)
	}
	if err := <-destroyed; err != nil {
		t.Fatal(err)
	}
	if recs, _ := rt.List(ctx); len(recs) != 0 || len(alloc.Allocations()) != 0 || len(l.Containers()) != 0 {
		t.Fatalf("left: %+v, %+v, %+v", recs, alloc.Allocations(), l.Containers())
	}
}

// TestLifecycleRecover: a new Lifecycle over the runtime's containers
// adopts them (running or exited) with their GPUs, even when the
// allocator's state was lost; leaves a live supervisor's container to it
// with its GPUs claimed; reports a container whose GPUs are another's; and
// gives back what vanished containers held.
func TestLifecycleRecover(t *testing.T) {
	ctx := context.Background()
	for _, lost := range []bool{false, true} {
		t.Run(fmt.Sprintf("state lost=%v", lost), func(t *testing.T) {
			inv, alloc := simAllocator(t, "dgx1-volta")
			rt := newFakeRuntime()
			l := newLifecycle(t, rt, alloc, nil)
			for id, n := range map[string]int{"run": 2, "ends": 1, "gone": 1} {
				if _, err := l.Launch(ctx, containerizer.Spec{ID: id, Command: []string{"x"}, GPUs: allocator.Request{Count: n}}); err != nil {
					t.Fatal(err)
				}
			}
			rt.end("ends", 4)
			// Another live process's container (this test's parent).
			parent, err := allocator.ProcessHolder("", os.Getppid())
			if err != nil {
				t.Fatal(err)
			}
			free := inv.Devices[alloc.Free()[0]].Ref()
			rt.ctrs["other"] = &fakeCtr{rec: containerizer.Record{ID: "other", RuntimeID: "other", GPUs: []node.DeviceRef{free}, Supervisor: &parent}, started: true}
			// The same GPU for a second owner: cannot be adopted.
			rt.ctrs["thief"] = &fakeCtr{rec: containerizer.Record{ID: "thief", RuntimeID: "thief", GPUs: []node.DeviceRef{free}}, started: true}
			rt.ctrs["broken"] = &fakeCtr{rec: containerizer.Record{RuntimeID: "broken", Err: errors.New("labels do not parse")}}
			var goneRT string
			for _, c := range l.Containers() {
				if c.ID == "gone" {
					goneRT = c.RuntimeID
				}
			}
			if lost {
				alloc = newAllocator(t, inv)
			}
			again := newLifecycle(t, rt, alloc, nil)
			// A container the first knew vanishes before the second starts;
			// the first recovers too and gives back its GPUs.
			rt.Remove(ctx, containerizer.Record{RuntimeID: goneRT})
			cs, err := again.Recover(ctx)
			if !errors.Is(err, containerizer.ErrNotAdopted) || !errors.Is(err, allocator.ErrDeviceUnavailable) {
				t.Fatalf("recover: %v; want the thief and the broken record reported", err)
			}
			var ids []string
			for _, c := range cs {
				ids = append(ids, fmt.Sprintf("%s:%s", c.ID, c.State))
			}
			if want := []string{"ends:exited", "run:running"}; !slices.Equal(ids, want) {
				t.Fatalf("adopted %v, want %v", ids, want)
			}
			if st, err := again.Wait(ctx, "ends"); err != nil || st.Code != 4 {
				t.Fatalf("wait for the adopted exited container: %+v, %v", st, err)
			}
			for owner, n := range map[string]int{"run": 2, "ends": 1, "other": 1} {
				if al, err := alloc.Allocation(owner); err != nil || len(al.Devices) != n {
					t.Errorf("%s holds %+v, %v; want %d GPUs", owner, al.Devices, err, n)
				}
			}
			if al, _ := alloc.Allocation("other"); al.Holder == nil || *al.Holder != parent {
				t.Errorf("other's GPUs are held by %+v, want its supervisor", al.Holder)
			}
			if _, err := alloc.Allocation("thief"); !errors.Is(err, allocator.ErrUnknownOwner) {
				t.Errorf("the thief holds GPUs: %v", err)
			}
			// The second's reconciliation released it: no runtime lists it.
			if _, err := alloc.Allocation("gone"); !errors.Is(err, allocator.ErrUnknownOwner) {
				t.Errorf("the vanished container's GPUs: %v, want released", err)
			}
			if !lost {
				if _, err := l.Recover(ctx); !errors.Is(err, containerizer.ErrNotAdopted) {
					t.Fatalf("the first's recover: %v", err)
				}
				if _, err := alloc.Allocation("gone"); !errors.Is(err, allocator.ErrUnknownOwner) {
					t.Errorf("the vanished container's GPUs: %v, want released", err)
				}
			}
			for _, id := range []string{"run", "ends"} {
				if err := again.Destroy(ctx, id); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestLifecycleReconcile: Recover releases the allocations of owners
// without a container, unless another live process holds them (it never
// releases another process's GPUs); the Lifecycle's own supervisor's and a
// dead process's go. A Recover whose runtime cannot list releases nothing.
func TestLifecycleReconcile(t *testing.T) {
	ctx := context.Background()
	self, err := allocator.ProcessHolder("", os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	parent, err := allocator.ProcessHolder("", os.Getppid())
	if err != nil {
		t.Fatal(err)
	}
	dead := allocator.Holder{Pid: self.Pid, Start: self.Start + 1}
	cases := []struct {
		name   string
		holder *allocator.Holder
		kept   bool
	}{
		{"no holder", nil, false},
		{"the lifecycle's supervisor", &self, false},
		{"a dead process", &dead, false},
		{"another live process", &parent, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, alloc := simAllocator(t, "dgx1-volta")
			if _, err := alloc.Allocate(ctx, "orphan", allocator.Request{Count: 1, Holder: tc.holder}); err != nil {
				t.Fatal(err)
			}
			rt := newFakeRuntime()
			rt.failList = errors.New("cannot list")
			l := newLifecycle(t, rt, alloc, func(c *containerizer.LifecycleConfig) { c.Supervisor = &self })
			if _, err := l.Recover(ctx); err == nil {
				t.Fatal("recover succeeded with a runtime that cannot list")
			}
			if _, err := alloc.Allocation("orphan"); err != nil {
				t.Fatalf("released by a recovery that could not list: %v", err)
			}
			rt.failList = nil
			if _, err := l.Recover(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := alloc.Allocation("orphan"); (err == nil) != tc.kept {
				t.Fatalf("orphan held=%v, want %v", err == nil, tc.kept)
			}
		})
	}
}

// TestNewLifecycleRejects: a Lifecycle needs a runtime, an allocator and a
// real supervisor, at most one runtime of a kind, and a supervisor that a
// runtime naming its own agrees with.
func TestNewLifecycleRejects(t *testing.T) {
	_, alloc := simAllocator(t, "dgx1-volta")
	self, err := allocator.ProcessHolder("", os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	parent, err := allocator.ProcessHolder("", os.Getppid())
	if err != nil {
		t.Fatal(err)
	}
	native := &fakeRuntime{kind: containerizer.KindNative}
	for name, cfg := range map[string]containerizer.LifecycleConfig{
		"no runtime":           {Allocator: alloc},
		"no allocator":         {Runtime: newFakeRuntime()},
		"bad supervisor":       {Runtime: newFakeRuntime(), Allocator: alloc, Supervisor: &allocator.Holder{Pid: 1}},
		"nil runtime":          {Runtimes: []containerizer.Runtime{newFakeRuntime(), nil}, Allocator: alloc},
		"two of a kind":        {Runtimes: []containerizer.Runtime{native, &fakeRuntime{kind: containerizer.KindNative}}, Allocator: alloc},
		"one given twice":      {Runtime: newFakeRuntime(), Runtimes: []containerizer.Runtime{newFakeRuntime()}, Allocator: alloc},
		"another supervisor":   {Runtime: supervisedRuntime{newFakeRuntime(), &self}, Allocator: alloc, Supervisor: &parent},
		"a runtime's own none": {Runtime: supervisedRuntime{newFakeRuntime(), nil}, Allocator: alloc, Supervisor: &parent},
	} {
		if l, err := containerizer.NewLifecycle(cfg); !errors.Is(err, node.ErrInvalid) || l != nil {
			t.Errorf("%s: %v, %v", name, l, err)
		}
	}
}

// supervisedRuntime is a runtime that names its containers' supervisor.
type supervisedRuntime struct {
	*fakeRuntime
	sup *allocator.Holder
}

func (s supervisedRuntime) Supervisor() *allocator.Holder { return s.sup }
