package containerizer

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/isolator/mps"
)

// One recovery serves both "this agent restarted" (Recover) and "a
// short-lived runner died" (Clean). Both read the runtime's records (List)
// and class each container by its supervisor:
//
//   - none (an agent's container) or a provably dead one: Recover adopts
//     it, as an agent that restarted expects (but removes one of a dead
//     supervisor that has exited too: no one is left to take its exit
//     status); Clean leaves an agent's alone and tears a dead supervisor's
//     down;
//   - this Lifecycle's own supervisor: its own, adopted by Recover;
//   - another live process: its, left to it by both; its GPUs are claimed
//     (allocator.Claim) so that a lost allocator state cannot hand them out.
//
// Adopting claims the container's GPUs (a no-op when the allocator holds
// them already, an error when they are another's) and the volume use
// again; a Lifecycle with a Supervisor takes over the containers of dead
// supervisors it adopts (Adopter, allocator.SetHolder). The allocator is
// the record of what a container holds: for a runtime that can bring a
// container in line with it (Repairer), what the allocator holds for the
// owner is claimed, whatever the container's record says (a process
// killed inside Update leaves them apart), and the runtime then enforces
// that again and records it.
//
// A runtime that reserves ids (Reserver) lists the reservations of
// launches not finished (Record.Reserved): those of dead processes (and,
// in Recover, of no supervisor) are removed with what their owner holds;
// the others are launches in progress, left alone. A Cleaner runtime then
// sweeps its own leftovers.

type supervision int

const (
	supNone supervision = iota
	supSelf
	supLive
	supDead
)

// supervision classes h, a container's supervisor, for a container of rt,
// telling the dead in the proc file system proc.
func (rt *routed) supervision(h *allocator.Holder, proc string) supervision {
	switch {
	case h == nil:
		return supNone
	case rt.sup != nil && *h == *rt.sup:
		return supSelf
	case allocator.HolderDead(proc, *h):
		return supDead
	}
	return supLive
}

// claim makes the allocator hold rec's GPUs (or its share) for its owner,
// and a memory share's MPS daemon run, and returns rec with what is held.
// With follow, the allocator is the record: where it holds the owner
// already, that is what is claimed (and returned), whatever rec says.
// holder, when set, holds them afterwards, in the claim's one change on
// disk (allocator.HeldBy).
func (l *Lifecycle) claim(ctx context.Context, rec Record, holder *allocator.Holder, follow bool) (Record, error) {
	var opts []allocator.ClaimOption
	if holder != nil {
		opts = append(opts, allocator.HeldBy(*holder))
	}
	var al allocator.Allocation
	var err error
	for range 3 {
		want := rec
		if follow {
			if cur, aerr := l.cfg.Allocator.Allocation(rec.ID); aerr == nil {
				want.GPUs, want.Share = cur.Devices, cur.Share
			}
		}
		claim := opts
		if want.Share != nil && len(want.GPUs) == 1 {
			claim = append(slices.Clone(opts), allocator.AsShare(*want.Share))
		}
		al, err = l.cfg.Allocator.Claim(ctx, rec.ID, want.GPUs, claim...)
		if !follow || !errors.Is(err, allocator.ErrClaimMismatch) {
			break
		}
		// The allocator changed between its reading and the claim.
	}
	if err != nil {
		return rec, err
	}
	if follow {
		rec.GPUs, rec.Share = slices.Clone(al.Devices), nil
		if al.Share != nil {
			s := *al.Share
			rec.Share = &s
		}
	}
	if l.cfg.MPS != nil {
		// A memory share's daemon, running already (idempotent), or
		// started again in place: the container's mounts of its
		// directories stay good.
		if _, err := l.cfg.MPS.StartShare(ctx, al); err != nil {
			return rec, err
		}
	}
	return rec, nil
}

// claimLive claims the GPUs of another live supervisor's container: held
// by that supervisor where the allocator had lost them (or held them with
// no holder); a holder the allocator names is kept, and so is what the
// allocator holds for the owner (its supervisor may be updating it).
func (l *Lifecycle) claimLive(ctx context.Context, rec Record) error {
	holder := rec.Supervisor
	if al, err := l.cfg.Allocator.Allocation(rec.ID); err == nil && al.Holder != nil {
		holder = nil
	}
	_, err := l.claim(ctx, rec, holder, true)
	return err
}

// Recover adopts the containers every runtime still has, with their GPUs
// and volume uses, and gives back what was held for the known containers
// that vanished. A container that cannot be adopted is left alone and
// reported in the joined error (matching ErrNotAdopted); the others are
// adopted all the same; a runtime that cannot list its containers does not
// keep the others from being recovered. It returns every container known
// afterwards.
//
// When every runtime listed its containers, Recover then reconciles the
// allocator once (allocator.Reconcile) against the union of what they
// list: every container, adopted or another live supervisor's, every
// launch in progress, and every allocation held by a live process
// (Request.Holder, allocator.SetHolder) other than this Lifecycle's
// supervisors. Every other allocation is released: the Lifecycle assumes
// that an allocation with no live holder is one of its runtimes' (a
// container that vanished while no process ran). A program that shares the
// allocator with something outside the Lifecycle (another Lifecycle with
// other runtimes, the chain isolator, a program of its own) keeps its
// allocations safe by holding them with a live process, or gives the
// Lifecycle an allocator of its own (a state directory of its own).
func (l *Lifecycle) Recover(ctx context.Context) ([]Container, error) {
	if !l.made() {
		return nil, fmt.Errorf("recover: %w", ErrNotMade)
	}
	var errs []error
	listedAll := true
	found := map[string]*lifeEntry{}
	listed := map[string]bool{} // owners with a container, adopted or not
	failed := map[*routed]bool{}
	for _, rt := range l.rts {
		records, err := rt.List(ctx)
		if err != nil {
			errs = append(errs, fmt.Errorf("recover %s: %w", rt.Kind(), err))
			listedAll, failed[rt] = false, true
			continue
		}
		errs = append(errs, l.adopt(ctx, rt, records, found, listed)...)
	}

	// The table: containers gone from their runtime leave it (and give
	// back what they held, unless another container of their owner is
	// listed); launches in flight, destructions at work and the containers
	// of a runtime that did not list are left as they are.
	var vanished []Record
	for _, x := range l.table.List(false) {
		if x.State == StateDestroying || failed[x.Value.rt] {
			continue
		}
		l.mu.Lock()
		rec := x.Value.rec
		l.mu.Unlock()
		if f, ok := found[x.ID]; !ok || f.rt != x.Value.rt || f.rec.RuntimeID != rec.RuntimeID {
			if !listed[x.ID] {
				vanished = append(vanished, rec)
			}
			l.table.Delete(x.ID)
		}
	}
	for _, id := range slices.Sorted(maps.Keys(found)) {
		f := found[id]
		if old, _, err := l.table.Get(id); err == nil {
			l.mu.Lock()
			same := old.rt == f.rt && old.rec.RuntimeID == f.rec.RuntimeID
			if same {
				// Known already: keep what it has, take the record's news.
				old.rec.GPUs, old.rec.Volume, old.rec.VolumeVersion = f.rec.GPUs, f.rec.Volume, f.rec.VolumeVersion
				if f.rec.Exit != nil && old.rec.Exit == nil {
					old.rec.Exit = f.rec.Exit
				}
			}
			l.mu.Unlock()
			if same && f.rec.Exit != nil {
				_, _ = l.table.Exited(id, old)
			}
			continue // the same container, or one launching or being destroyed
		}
		st := StateRunning
		if f.rec.Exit != nil {
			st = StateExited
		}
		if err := l.table.Adopt(id, st, f); err != nil {
			errs = append(errs, fmt.Errorf("recover: %w", err))
		}
	}
	for _, rec := range vanished {
		if err := l.release(ctx, rec.ID, rec.VolumeVersion, false); err != nil {
			errs = append(errs, fmt.Errorf("recover: release vanished %s: %w", rec.ID, err))
		}
	}
	if !listedAll {
		// What the runtime that did not list holds is not known: nothing
		// is released, nothing swept.
		return l.Containers(), errors.Join(errs...)
	}
	if _, err := l.cfg.Allocator.Reconcile(ctx, l.live(listed)); err != nil {
		errs = append(errs, fmt.Errorf("recover: %w", err))
	}
	errs = append(errs, l.sweep(ctx, true, len(errs) > 0), l.sweepDaemons(ctx))
	return l.Containers(), errors.Join(errs...)
}

// adopt deals with the records rt listed: reservations and ended
// containers no one is left for are removed, the containers of other live
// supervisors claimed, and the others adopted into found. Every owner with
// a container goes into listed.
func (l *Lifecycle) adopt(ctx context.Context, rt *routed, records []Record, found map[string]*lifeEntry, listed map[string]bool) []error {
	var errs []error
	for _, r := range records {
		if r.Err != nil {
			// Left alone, with what its owner holds.
			if r.ID != "" {
				listed[r.ID] = true
			}
			errs = append(errs, fmt.Errorf("recover: %w", notAdopted(rt, r, r.Err)))
			continue
		}
		if r.Reserved {
			// A launch in progress (another live process's, or this
			// Lifecycle's), or one a dead process left, which goes.
			if _, _, err := l.table.Get(r.ID); err == nil || rt.supervision(r.Supervisor, l.proc) == supLive {
				listed[r.ID] = true
			} else if err := l.unlaunch(ctx, rt, r); err != nil {
				listed[r.ID] = true
				errs = append(errs, fmt.Errorf("recover %s: %w", r.ID, err))
			}
			continue
		}
		sup := rt.supervision(r.Supervisor, l.proc)
		if sup == supDead && r.Exit != nil && r.ID != "" {
			// Ended with its supervisor gone: no one is left to take its
			// exit status, and what it held goes back.
			if _, _, err := l.table.Get(r.ID); err != nil {
				if err := l.unlaunch(ctx, rt, r); err != nil {
					listed[r.ID] = true
					errs = append(errs, fmt.Errorf("recover %s: %w", r.ID, err))
				}
				continue
			}
		}
		listed[r.ID] = true
		if sup == supLive {
			// Another live process's: its GPUs stay held, it stays its.
			if err := l.claimLive(ctx, r); err != nil {
				errs = append(errs, fmt.Errorf("recover: %w", notAdopted(rt, r, err)))
			}
			continue
		}
		if other, dup := found[r.ID]; dup {
			errs = append(errs, fmt.Errorf("recover: %w", notAdopted(rt, r, fmt.Errorf("owner %s has another container (%s): %w", r.ID, other.rt.Kind(), ErrContainerExists))))
			continue
		}
		// A dead supervisor's container is taken over, in the claim: its
		// GPUs held by this Lifecycle's supervisor in one change on disk.
		var holder *allocator.Holder
		if sup == supDead && rt.sup != nil {
			holder = rt.sup
		}
		rep, repairs := rt.Runtime.(Repairer)
		claimed, err := l.claim(ctx, r, holder, repairs)
		if err != nil {
			errs = append(errs, fmt.Errorf("recover: %w", notAdopted(rt, r, err)))
			continue
		}
		r = claimed
		if holder != nil {
			if r, err = l.takeOver(ctx, rt, r); err != nil {
				errs = append(errs, fmt.Errorf("recover: %w", notAdopted(rt, r, err)))
				continue
			}
		}
		if repairs {
			// Its devices and record as the allocator has them: a process
			// killed inside Update may have left either behind. It is
			// adopted either way, holding what it holds.
			if fixed, err := rep.Repair(ctx, l.cfg.Allocator, r); err != nil {
				errs = append(errs, fmt.Errorf("recover %s: %w", r.ID, err))
			} else {
				r = fixed
			}
		}
		if r.VolumeVersion != "" && l.cfg.Volumes != nil {
			if err := l.cfg.Volumes.Acquire(ctx, r.VolumeVersion, r.ID); err != nil {
				errs = append(errs, fmt.Errorf("recover %s: %w", r.ID, err))
			}
		}
		found[r.ID] = &lifeEntry{rt: rt, rec: r}
	}
	return errs
}

// live is every owner the Lifecycle's reconciliation of the allocator
// keeps: those with a container listed, the launches in flight, and the
// allocations a live process other than the Lifecycle's supervisors holds.
func (l *Lifecycle) live(listed map[string]bool) []string {
	live := slices.Collect(maps.Keys(listed))
	for _, x := range l.table.List(true) {
		live = append(live, x.ID) // a launch in flight holds its GPUs
	}
	for _, al := range l.cfg.Allocator.Allocations() {
		if h := al.Holder; h != nil && !l.supervises(*h) && !allocator.HolderDead(l.proc, *h) {
			live = append(live, al.Owner) // another process's
		}
	}
	slices.Sort(live)
	return slices.Compact(live)
}

// supervises tells whether h is the supervisor of one of the runtimes.
func (l *Lifecycle) supervises(h allocator.Holder) bool {
	return slices.ContainsFunc(l.rts, func(rt *routed) bool { return rt.sup != nil && *rt.sup == h })
}

// takeOver records this Lifecycle's supervisor as that of rec's
// container, whose supervisor died, on the runtime's side (Adopter), so
// that a Clean of another process does not take the container for a dead
// one's; the claim made it the holder of its GPUs.
func (l *Lifecycle) takeOver(ctx context.Context, rt *routed, rec Record) (Record, error) {
	sup := *rt.sup
	if a, ok := rt.Runtime.(Adopter); ok {
		r, err := a.Adopt(ctx, rec, sup)
		if err != nil {
			return rec, err
		}
		rec = r
	}
	rec.Supervisor = &sup
	return rec, nil
}

// unlaunch removes what a launch that did not finish left (a reservation,
// perhaps a container), or an ended container whose supervisor died, and
// gives back what was held for its owner.
func (l *Lifecycle) unlaunch(ctx context.Context, rt *routed, rec Record) error {
	l.log.InfoContext(ctx, "removing a container no one can use", "id", rec.ID, "kind", rt.Kind(), "reserved", rec.Reserved)
	return l.remove(ctx, rt, rec, false)
}

// sweepDaemons stops the MPS daemons of owners that hold no memory share
// in the allocator and have no container or launch: daemons whose share
// was released past the Lifecycle (an allocator reconciliation, a holder's
// death), or whose starter was killed. The runtimes' containers are listed
// under the daemons' lock, so a launch of another process whose daemon
// runs is listed (its reservation came first).
func (l *Lifecycle) sweepDaemons(ctx context.Context) error {
	if l.cfg.MPS == nil {
		return nil
	}
	var listed map[string]bool
	recorded := func(owner string) bool {
		if _, _, err := l.table.Get(owner); err == nil {
			return true
		}
		if listed == nil {
			listed = map[string]bool{}
			for _, rt := range l.rts {
				recs, err := rt.List(ctx)
				if err != nil {
					listed = nil
					return true // cannot tell: kept
				}
				for _, r := range recs {
					listed[r.ID] = true
				}
			}
		}
		return listed[owner]
	}
	keep := mps.Keep{Shares: l.cfg.Allocator, Recorded: recorded}
	if stopped, err := l.cfg.MPS.Sweep(ctx, keep.Keeps); err != nil || len(stopped) > 0 {
		l.log.InfoContext(ctx, "stopped the MPS daemons of released shares", "owners", stopped, "err", err)
		return err
	}
	return nil
}

// sweep has every Cleaner runtime remove its leftovers, after Recover
// (adopting) or Clean.
func (l *Lifecycle) sweep(ctx context.Context, adopting, failed bool) error {
	var errs []error
	for _, rt := range l.rts {
		c, ok := rt.Runtime.(Cleaner)
		if !ok {
			continue
		}
		if err := c.Sweep(ctx, Sweep{Adopting: adopting, Failed: failed}); err != nil {
			errs = append(errs, fmt.Errorf("sweep %s: %w", rt.Kind(), err))
		}
	}
	return errors.Join(errs...)
}

// Clean is the recovery of programs that run their containers only while
// they live (see LifecycleConfig.Supervisor), as Recover is that of an
// agent whose containers outlive it. In order:
//
//  1. it notes the allocator's owners whose holder is provably dead (before
//     listing, so that a run dead by then has no container the listing
//     misses);
//  2. every container whose supervisor is provably dead, or whose owner is
//     one of those, is removed, and its GPUs and its use of the driver
//     volume are given back;
//  3. the containers of other live supervisors have their GPUs claimed,
//     held by their supervisor where the allocator had lost them;
//  4. the dead owners left without a container give back their GPUs and
//     their uses of the volume.
//
// Containers without a supervisor, and this Lifecycle's own, are left
// alone. Clean returns the owners it cleaned up, sorted; errors are joined,
// and one container that cannot be cleaned does not stop the others. When
// several processes share the allocator's state directory, run Clean and
// the Launch that follows it in one allocator.Exclusive, so that no other
// process acts in between.
func (l *Lifecycle) Clean(ctx context.Context) ([]string, error) {
	if !l.made() {
		return nil, fmt.Errorf("clean: %w", ErrNotMade)
	}
	dead := map[string]bool{}
	for _, al := range l.cfg.Allocator.Allocations() {
		if al.Holder != nil && allocator.HolderDead(l.proc, *al.Holder) {
			dead[al.Owner] = true
		}
	}
	// Every runtime lists first: while one cannot, a dead owner may still
	// have a container there, and nothing is done.
	type listing struct {
		rt      *routed
		records []Record
	}
	var all []listing
	for _, rt := range l.rts {
		records, err := rt.List(ctx)
		if err != nil {
			return nil, fmt.Errorf("clean %s: %w", rt.Kind(), err)
		}
		all = append(all, listing{rt, records})
	}
	var cleaned []string
	var errs []error
	failed := false // a dead supervisor's container is left
	for _, x := range all {
		cs, ok, es := l.clean(ctx, x.rt, x.records, dead)
		cleaned, failed, errs = append(cleaned, cs...), failed || !ok, append(errs, es...)
	}
	for _, owner := range slices.Sorted(maps.Keys(dead)) {
		if err := l.release(ctx, owner, "", true); err != nil {
			errs = append(errs, fmt.Errorf("clean %s: %w", owner, err))
			continue
		}
		cleaned = append(cleaned, owner)
	}
	errs = append(errs, l.sweep(ctx, false, failed), l.sweepDaemons(ctx))
	slices.Sort(cleaned)
	return slices.Compact(cleaned), errors.Join(errs...)
}

// clean is Clean's second and third steps over the records rt listed: it
// returns the owners it cleaned up, whether it removed every container of
// a dead supervisor, and its errors. The owners it cleaned up leave dead.
func (l *Lifecycle) clean(ctx context.Context, rt *routed, records []Record, dead map[string]bool) (cleaned []string, ok bool, errs []error) {
	failed := false
	for _, r := range records {
		switch sup := rt.supervision(r.Supervisor, l.proc); {
		case sup == supDead || (r.ID != "" && dead[r.ID]):
			l.log.InfoContext(ctx, "removing a container whose supervisor died", "id", r.ID, "kind", rt.Kind(), "runtime id", r.RuntimeID)
			if err := l.remove(ctx, rt, r, false); err != nil {
				failed, errs = true, append(errs, fmt.Errorf("clean %s: %w", r.ID, err))
				continue
			}
			if r.ID != "" {
				delete(dead, r.ID)
				cleaned = append(cleaned, r.ID)
			}
		case r.Reserved:
			// A launch in progress: its GPUs are held by its supervisor.
		case sup == supLive && r.Err == nil:
			if err := l.claimLive(ctx, r); err != nil {
				errs = append(errs, fmt.Errorf("clean: %w", notAdopted(rt, r, err)))
			}
		case sup == supLive:
			errs = append(errs, fmt.Errorf("clean: %w", notAdopted(rt, r, r.Err)))
		}
	}
	return cleaned, !failed, errs
}

// notAdopted is why rt's container rec is not adopted.
func notAdopted(rt *routed, rec Record, err error) *NotAdoptedError {
	return &NotAdoptedError{ID: rec.ID, RuntimeID: rec.RuntimeID, Kind: rt.Kind(), Err: err}
}
