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

// reservingRuntime is a fakeRuntime that reserves ids (Reserver), records
// supervisors (Adopter) and has leftovers of its own (Cleaner).
type reservingRuntime struct {
	*fakeRuntime
	alloc *allocator.Allocator
	sup   *allocator.Holder // what Reserve records as the supervisor

	rmu      sync.Mutex
	reserved map[string]*allocator.Holder
	// heldAtReserve and heldAtUnreserve say whether the owner held GPUs
	// when its id was reserved and when its reservation was dropped.
	heldAtReserve, heldAtUnreserve map[string]bool
	adopted                        map[string]allocator.Holder
	sweeps                         []containerizer.Sweep
	failSweep, failRemove          error
}

var (
	_ containerizer.Reserver = (*reservingRuntime)(nil)
	_ containerizer.Adopter  = (*reservingRuntime)(nil)
	_ containerizer.Cleaner  = (*reservingRuntime)(nil)
)

func newReservingRuntime(alloc *allocator.Allocator, sup *allocator.Holder) *reservingRuntime {
	return &reservingRuntime{
		fakeRuntime: newFakeRuntime(), alloc: alloc, sup: sup,
		reserved:      map[string]*allocator.Holder{},
		heldAtReserve: map[string]bool{}, heldAtUnreserve: map[string]bool{},
		adopted: map[string]allocator.Holder{},
	}
}

func (r *reservingRuntime) holds(id string) bool {
	_, err := r.alloc.Allocation(id)
	return err == nil
}

func (r *reservingRuntime) Reserve(_ context.Context, spec containerizer.Spec) error {
	r.rmu.Lock()
	defer r.rmu.Unlock()
	if _, ok := r.reserved[spec.ID]; ok {
		return fmt.Errorf("reserve %s: %w", spec.ID, containerizer.ErrContainerExists)
	}
	r.reserved[spec.ID] = r.sup
	r.heldAtReserve[spec.ID] = r.holds(spec.ID)
	return nil
}

func (r *reservingRuntime) Unreserve(_ context.Context, id string) error {
	r.rmu.Lock()
	defer r.rmu.Unlock()
	if _, ok := r.reserved[id]; ok {
		r.heldAtUnreserve[id] = r.holds(id)
	}
	delete(r.reserved, id)
	return nil
}

func (r *reservingRuntime) isReserved(id string) bool {
	r.rmu.Lock()
	defer r.rmu.Unlock()
	_, ok := r.reserved[id]
	return ok
}

func (r *reservingRuntime) Adopt(_ context.Context, rec containerizer.Record, sup allocator.Holder) (containerizer.Record, error) {
	r.rmu.Lock()
	r.adopted[rec.ID] = sup
	r.rmu.Unlock()
	r.mu.Lock()
	defer r.mu.Unlock()
	if c, ok := r.ctrs[rec.RuntimeID]; ok {
		c.rec.Supervisor = &sup
	}
	rec.Supervisor = &sup
	return rec, nil
}

func (r *reservingRuntime) Remove(ctx context.Context, rec containerizer.Record) error {
	if r.failRemove != nil {
		return r.failRemove
	}
	return r.fakeRuntime.Remove(ctx, rec)
}

func (r *reservingRuntime) Sweep(_ context.Context, s containerizer.Sweep) error {
	r.rmu.Lock()
	defer r.rmu.Unlock()
	r.sweeps = append(r.sweeps, s)
	return r.failSweep
}

// List adds the reservations that have no container, as Reserved records.
func (r *reservingRuntime) List(ctx context.Context) ([]containerizer.Record, error) {
	recs, err := r.fakeRuntime.List(ctx)
	if err != nil {
		return nil, err
	}
	r.rmu.Lock()
	defer r.rmu.Unlock()
	for id, sup := range r.reserved {
		if !slices.ContainsFunc(recs, func(rec containerizer.Record) bool { return rec.ID == id }) {
			recs = append(recs, containerizer.Record{ID: id, Supervisor: sup, Reserved: true})
		}
	}
	return recs, nil
}

// TestLifecycleReserver: the id is reserved before anything is held and
// its reservation dropped only once everything is given back, on Destroy
// as on a launch that fails; a reservation refused leaves nothing.
func TestLifecycleReserver(t *testing.T) {
	ctx := context.Background()
	_, alloc := simAllocator(t, "dgx1-volta")
	rt := newReservingRuntime(alloc, nil)
	l := newLifecycle(t, rt, alloc, nil)

	if _, err := l.Launch(ctx, containerizer.Spec{ID: "a", Command: []string{"x"}, GPUs: allocator.Request{Count: 2}}); err != nil {
		t.Fatal(err)
	}
	if !rt.isReserved("a") || rt.heldAtReserve["a"] {
		t.Fatalf("a reserved=%v, held gpus when reserved=%v; want reserved before its gpus", rt.isReserved("a"), rt.heldAtReserve["a"])
	}
	if err := l.Destroy(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if rt.isReserved("a") || rt.heldAtUnreserve["a"] {
		t.Fatalf("after destroy: reserved=%v, held gpus when unreserved=%v", rt.isReserved("a"), rt.heldAtUnreserve["a"])
	}

	cases := []struct {
		name  string
		setup func() func()
		want  error
	}{
		{"start fails", func() func() {
			rt.failStart = fmt.Errorf("start: %w", os.ErrPermission)
			return func() { rt.failStart = nil }
		}, os.ErrPermission},
		{"id already reserved", func() func() {
			rt.reserved["b"] = nil
			return func() { delete(rt.reserved, "b") }
		}, containerizer.ErrContainerExists},
		{"prepare refuses", func() func() { return func() {} }, allocator.ErrInvalidRequest},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			undo := tc.setup()
			n := 1
			if tc.want == allocator.ErrInvalidRequest {
				n = 9
			}
			_, err := l.Launch(ctx, containerizer.Spec{ID: "b", Command: []string{"x"}, GPUs: allocator.Request{Count: n}})
			if !errors.Is(err, tc.want) {
				t.Fatalf("launch: %v, want %v", err, tc.want)
			}
			reserved := rt.isReserved("b")
			undo()
			recs, _ := rt.fakeRuntime.List(ctx)
			if len(recs) != 0 || len(alloc.Allocations()) != 0 || len(l.Containers()) != 0 {
				t.Fatalf("left: %+v, %+v, %+v", recs, alloc.Allocations(), l.Containers())
			}
			if tc.want != containerizer.ErrContainerExists && (reserved || rt.heldAtUnreserve["b"]) {
				t.Fatalf("reserved=%v, held gpus when unreserved=%v", reserved, rt.heldAtUnreserve["b"])
			}
		})
	}
}

// TestLifecycleRecoversReservations: a reservation a dead process left is
// removed with what its owner held, by Recover as by Clean; one of a live
// process, or of a launch of this Lifecycle in progress, is left alone;
// then the runtime sweeps, told what the recovery did.
func TestLifecycleRecoversReservations(t *testing.T) {
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
		name    string
		sup     *allocator.Holder
		recover bool
		gone    bool
	}{
		{name: "clean: dead supervisor", sup: &dead, gone: true},
		{name: "clean: live supervisor", sup: &parent},
		{name: "clean: no supervisor", sup: nil},
		{name: "recover: dead supervisor", sup: &dead, recover: true, gone: true},
		{name: "recover: no supervisor", sup: nil, recover: true, gone: true},
		{name: "recover: live supervisor", sup: &parent, recover: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, alloc := simAllocator(t, "dgx1-volta")
			rt := newReservingRuntime(alloc, nil)
			rt.reserved["left"] = tc.sup
			if _, err := alloc.Allocate(ctx, "left", allocator.Request{Count: 2, Holder: tc.sup}); err != nil {
				t.Fatal(err)
			}
			l := newLifecycle(t, rt, alloc, nil)
			var cleaned []string
			if tc.recover {
				_, err = l.Recover(ctx)
			} else {
				cleaned, err = l.Clean(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
			if gone := !rt.isReserved("left") && !rt.holds("left"); gone != tc.gone {
				t.Fatalf("reservation and gpus gone=%v (reserved %v, held %v), want %v", gone, rt.isReserved("left"), rt.holds("left"), tc.gone)
			}
			if tc.gone && rt.heldAtUnreserve["left"] {
				t.Fatal("unreserved before the gpus were given back")
			}
			if !tc.recover && tc.gone && !slices.Equal(cleaned, []string{"left"}) {
				t.Fatalf("cleaned %v", cleaned)
			}
			if want := []containerizer.Sweep{{Adopting: tc.recover}}; !slices.Equal(rt.sweeps, want) {
				t.Fatalf("sweeps %+v, want %+v", rt.sweeps, want)
			}
		})
	}

	t.Run("recover: a launch of its own in progress", func(t *testing.T) {
		_, alloc := simAllocator(t, "dgx1-volta")
		rt := newReservingRuntime(alloc, nil)
		rt.gate, rt.entered = make(chan struct{}), make(chan struct{}, 1)
		l := newLifecycle(t, rt, alloc, nil)
		launched := make(chan error, 1)
		go func() {
			_, err := l.Launch(ctx, containerizer.Spec{ID: "a", Command: []string{"x"}, GPUs: allocator.Request{Count: 1}})
			launched <- err
		}()
		<-rt.entered // reserved and prepared, not created
		if _, err := l.Recover(ctx); err != nil {
			t.Fatal(err)
		}
		if !rt.isReserved("a") || !rt.holds("a") {
			t.Fatalf("recover took a launch in progress: reserved %v, held %v", rt.isReserved("a"), rt.holds("a"))
		}
		close(rt.gate)
		if err := <-launched; err != nil {
			t.Fatal(err)
		}
	})

	t.Run("a failed removal says so to the sweep", func(t *testing.T) {
		_, alloc := simAllocator(t, "dgx1-volta")
		rt := newReservingRuntime(alloc, nil)
		rt.failSweep = os.ErrDeadlineExceeded
		rt.failRemove = os.ErrPermission
		rt.ctrs["broken"] = &fakeCtr{rec: containerizer.Record{RuntimeID: "broken", Supervisor: &parent, Err: errors.New("unreadable")}}
		l := newLifecycle(t, rt, alloc, nil)
		// A live supervisor's unreadable record is reported, and is no
		// failure to remove a dead one's container.
		if _, err := l.Clean(ctx); !errors.Is(err, containerizer.ErrNotAdopted) || !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("clean: %v; want the broken record and the sweep's error", err)
		}
		rt.ctrs["orphan"] = &fakeCtr{rec: containerizer.Record{ID: "orphan", RuntimeID: "orphan", Supervisor: &dead}, started: true}
		if _, err := l.Clean(ctx); !errors.Is(err, os.ErrPermission) {
			t.Fatalf("clean: %v; want the failed removal", err)
		}
		if want := []containerizer.Sweep{{}, {Failed: true}}; !slices.Equal(rt.sweeps, want) {
			t.Fatalf("sweeps %+v, want %+v", rt.sweeps, want)
		}
	})
}

// TestLifecycleTakesOver: a Lifecycle with a supervisor that adopts a
// container of a dead supervisor makes itself its supervisor, on the
// runtime's side and as the holder of its GPUs, so that another process's
// Clean no longer takes it for a dead one's; one without leaves it as is.
func TestLifecycleTakesOver(t *testing.T) {
	ctx := context.Background()
	self, err := allocator.ProcessHolder("", os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	dead := allocator.Holder{Pid: self.Pid, Start: self.Start + 1}
	for _, supervised := range []bool{false, true} {
		t.Run(fmt.Sprintf("supervisor=%v", supervised), func(t *testing.T) {
			inv, alloc := simAllocator(t, "dgx1-volta")
			rt := newReservingRuntime(alloc, nil)
			gpus := []node.DeviceRef{inv.Devices[0].Ref(), inv.Devices[1].Ref()}
			rt.ctrs["c1"] = &fakeCtr{rec: containerizer.Record{ID: "run", RuntimeID: "c1", GPUs: gpus, Supervisor: &dead}, started: true}
			var mod func(*containerizer.LifecycleConfig)
			if supervised {
				mod = func(c *containerizer.LifecycleConfig) { c.Supervisor = &self }
			}
			l := newLifecycle(t, rt, alloc, mod)
			if cs, err := l.Recover(ctx); err != nil || len(cs) != 1 {
				t.Fatalf("recover: %+v, %v", cs, err)
			}
			al, err := alloc.Allocation("run")
			if err != nil {
				t.Fatal(err)
			}
			sup, adopted := rt.adopted["run"]
			if held := al.Holder != nil && *al.Holder == self; held != supervised || adopted != supervised || (adopted && sup != self) {
				t.Fatalf("gpus held by %+v, runtime told %v (%+v)", al.Holder, adopted, sup)
			}
			// Another process's Clean: the container stays only when taken over.
			other := newLifecycle(t, rt, alloc, nil)
			cleaned, err := other.Clean(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if gone := slices.Equal(cleaned, []string{"run"}); gone == supervised {
				t.Fatalf("supervisor=%v: another's clean removed %v", supervised, cleaned)
			}
		})
	}
}

// TestLifecycleRecoverEndedOfDead: Recover removes a container whose
// supervisor died and whose command has ended, giving back its GPUs (no
// one is left to take its exit status); one that still runs is adopted,
// and an ended one without a supervisor (an agent's) is adopted as exited.
func TestLifecycleRecoverEndedOfDead(t *testing.T) {
	ctx := context.Background()
	self, err := allocator.ProcessHolder("", os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	dead := allocator.Holder{Pid: self.Pid, Start: self.Start + 1}
	inv, alloc := simAllocator(t, "dgx1-volta")
	rt := newReservingRuntime(alloc, nil)
	ended := &containerizer.ExitStatus{Code: 3}
	for i, c := range []struct {
		id   string
		sup  *allocator.Holder
		exit *containerizer.ExitStatus
	}{{"ended", &dead, ended}, {"runs", &dead, nil}, {"agents", nil, ended}} {
		gpus := []node.DeviceRef{inv.Devices[i].Ref()}
		if _, err := alloc.Claim(ctx, c.id, gpus); err != nil {
			t.Fatal(err)
		}
		rt.reserved[c.id] = c.sup
		rt.ctrs[c.id] = &fakeCtr{rec: containerizer.Record{ID: c.id, RuntimeID: c.id, GPUs: gpus, Supervisor: c.sup}, exit: c.exit, started: true}
	}
	l := newLifecycle(t, rt, alloc, func(c *containerizer.LifecycleConfig) { c.Supervisor = &self })
	cs, err := l.Recover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range cs {
		got = append(got, fmt.Sprintf("%s:%s", c.ID, c.State))
	}
	if want := []string{"agents:exited", "runs:running"}; !slices.Equal(got, want) {
		t.Fatalf("recovered %v, want %v", got, want)
	}
	if rt.get("ended") != nil || rt.isReserved("ended") || rt.holds("ended") {
		t.Fatalf("the ended container of a dead supervisor is left: container %v, reserved %v, gpus %v", rt.get("ended") != nil, rt.isReserved("ended"), rt.holds("ended"))
	}
	if rt.heldAtUnreserve["ended"] {
		t.Fatal("unreserved before its gpus were given back")
	}
}

// TestLifecycleKeepsLiveSupervisors: a Lifecycle's reconciliation keeps
// the GPUs of the containers its runtime lists for another live
// supervisor, of launches in progress elsewhere (reservations), and of
// owners another live process holds though nothing here explains them;
// GPUs of an owner with no live holder and no container are released.
func TestLifecycleKeepsLiveSupervisors(t *testing.T) {
	ctx := context.Background()
	parent, err := allocator.ProcessHolder("", os.Getppid())
	if err != nil {
		t.Fatal(err)
	}
	inv, alloc := simAllocator(t, "dgx1-volta")
	rt := newReservingRuntime(alloc, nil)
	gpu := []node.DeviceRef{inv.Devices[0].Ref()}
	rt.ctrs["other"] = &fakeCtr{rec: containerizer.Record{ID: "other", RuntimeID: "other", GPUs: gpu, Supervisor: &parent}, started: true}
	rt.reserved["launching"] = &parent
	if _, err := alloc.Claim(ctx, "other", gpu); err != nil {
		t.Fatal(err)
	}
	for owner, h := range map[string]*allocator.Holder{"launching": &parent, "elsewhere": &parent, "ghost": nil} {
		if _, err := alloc.Allocate(ctx, owner, allocator.Request{Count: 1, Holder: h}); err != nil {
			t.Fatal(err)
		}
	}
	l := newLifecycle(t, rt, alloc, nil)
	if _, err := l.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	for owner, want := range map[string]bool{"other": true, "launching": true, "elsewhere": true, "ghost": false} {
		if _, err := alloc.Allocation(owner); (err == nil) != want {
			t.Errorf("%s holds gpus: %v, want %v", owner, err == nil, want)
		}
	}
}
