package containerizer

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/gpuiso/gpuiso/allocator"
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
// Adopting claims the recorded GPUs (a no-op when the allocator holds them
// already, an error when they are another's) and the volume use again; a
// Lifecycle with a Supervisor takes over the containers of dead
// supervisors it adopts (Adopter, allocator.SetHolder).
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

func (l *Lifecycle) supervision(h *allocator.Holder) supervision {
	switch {
	case h == nil:
		return supNone
	case l.cfg.Supervisor != nil && *h == *l.cfg.Supervisor:
		return supSelf
	case h.Dead(""):
		return supDead
	}
	return supLive
}

// claim makes the allocator hold rec's GPUs (or its share) for its owner,
// and a memory share's MPS daemon run; holder, where they had to be
// claimed again, holds them.
func (l *Lifecycle) claim(ctx context.Context, rec Record, holder *allocator.Holder) error {
	var al allocator.Allocation
	var err error
	if rec.Share != nil && len(rec.GPUs) == 1 {
		al, err = l.cfg.Allocator.ClaimShare(ctx, rec.ID, rec.GPUs[0], *rec.Share)
	} else {
		al, err = l.cfg.Allocator.Claim(ctx, rec.ID, rec.GPUs)
	}
	if err != nil {
		return fmt.Errorf("%w: %w", ErrNotAdopted, err)
	}
	if rec.Share != nil && rec.Share.Mode == allocator.ShareMemory && len(rec.GPUs) == 1 && l.cfg.MPS != nil {
		// Running already (idempotent), or started again in place: the
		// container's mounts of its directories stay good.
		if _, err := l.cfg.MPS.Start(ctx, rec.ID, rec.GPUs[0], ShareLimits(*rec.Share)); err != nil {
			return err
		}
	}
	if holder != nil && al.Holder == nil && len(al.Devices) > 0 {
		return l.cfg.Allocator.SetHolder(ctx, rec.ID, holder)
	}
	return nil
}

// Recover adopts the containers the runtime still has, with their GPUs
// and volume uses, and gives back what was held for the known containers
// that vanished; with ReconcileAllocator it also releases the allocations
// of owners that have no container. A container that cannot be adopted is
// left alone and reported in the joined error (matching ErrNotAdopted);
// the others are adopted all the same. It returns every container known
// afterwards.
func (l *Lifecycle) Recover(ctx context.Context) ([]Container, error) {
	cs, _, err := l.recoverHolding(ctx)
	return cs, err
}

// holdingRecoverer is a back end whose recovery also tells every owner
// that may hold GPUs through it: its containers, those of other live
// supervisors and the launches in progress (a Lifecycle). A Composite
// reconciles the allocator against them.
type holdingRecoverer interface {
	recoverHolding(ctx context.Context) ([]Container, []string, error)
}

var _ holdingRecoverer = (*Lifecycle)(nil)

// recoverHolding is Recover; it also returns the owners that may hold
// GPUs through this Lifecycle, which ReconcileAllocator keeps.
func (l *Lifecycle) recoverHolding(ctx context.Context) ([]Container, []string, error) {
	if !l.made() {
		return nil, nil, fmt.Errorf("recover: %w", ErrNotMade)
	}
	records, err := l.cfg.Runtime.List(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("recover: %w", err)
	}
	var errs []error
	found := map[string]*lifeEntry{}
	listed := map[string]bool{} // owners with a container, adopted or not
	for _, r := range records {
		if r.Err != nil {
			errs = append(errs, fmt.Errorf("recover container %s: %w: %w", r.RuntimeID, ErrNotAdopted, r.Err))
			continue
		}
		if r.Reserved {
			// A launch in progress (another live process's, or this
			// Lifecycle's), or one a dead process left, which goes.
			if _, _, err := l.table.Get(r.ID); err == nil || l.supervision(r.Supervisor) == supLive {
				listed[r.ID] = true
			} else if err := l.unlaunch(ctx, r); err != nil {
				listed[r.ID] = true
				errs = append(errs, fmt.Errorf("recover %s: %w", r.ID, err))
			}
			continue
		}
		sup := l.supervision(r.Supervisor)
		if sup == supDead && r.Exit != nil && r.ID != "" {
			// Ended with its supervisor gone: no one is left to take its
			// exit status, and what it held goes back.
			if _, _, err := l.table.Get(r.ID); err != nil {
				if err := l.unlaunch(ctx, r); err != nil {
					listed[r.ID] = true
					errs = append(errs, fmt.Errorf("recover %s: %w", r.ID, err))
				}
				continue
			}
		}
		listed[r.ID] = true
		if sup == supLive {
			// Another live process's: its GPUs stay held, it stays its.
			if err := l.claim(ctx, r, r.Supervisor); err != nil {
				errs = append(errs, fmt.Errorf("recover container %s: %w", r.RuntimeID, err))
			}
			continue
		}
		if _, dup := found[r.ID]; dup {
			errs = append(errs, fmt.Errorf("recover container %s: %w: owner %s has another container", r.RuntimeID, ErrNotAdopted, r.ID))
			continue
		}
		if err := l.claim(ctx, r, nil); err != nil {
			errs = append(errs, fmt.Errorf("recover container %s: %w", r.RuntimeID, err))
			continue
		}
		if sup == supDead && l.cfg.Supervisor != nil {
			var err error
			if r, err = l.takeOver(ctx, r); err != nil {
				errs = append(errs, fmt.Errorf("recover container %s: %w: %w", r.RuntimeID, ErrNotAdopted, err))
				continue
			}
		}
		if r.VolumeVersion != "" && l.cfg.Volumes != nil {
			if err := l.cfg.Volumes.Acquire(ctx, r.VolumeVersion, r.ID); err != nil {
				errs = append(errs, fmt.Errorf("recover %s: %w", r.ID, err))
			}
		}
		found[r.ID] = &lifeEntry{rec: r, exit: r.Exit}
	}

	// The table: containers gone from the runtime leave it (and give back
	// what they held, unless another container of their owner is listed);
	// launches in flight and destructions at work are left to finish.
	var vanished []Record
	for _, x := range l.table.List(false) {
		if x.State == StateDestroying {
			continue
		}
		l.mu.Lock()
		rec := x.Value.rec
		l.mu.Unlock()
		if f, ok := found[x.ID]; !ok || f.rec.RuntimeID != rec.RuntimeID {
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
			same := old.rec.RuntimeID == f.rec.RuntimeID
			if same {
				// Known already: keep what it has, take the record's news.
				old.rec.GPUs, old.rec.Volume, old.rec.VolumeVersion = f.rec.GPUs, f.rec.Volume, f.rec.VolumeVersion
				if f.exit != nil && old.exit == nil {
					old.exit = f.exit
				}
			}
			l.mu.Unlock()
			if same && f.exit != nil {
				_, _ = l.table.Exited(id, old)
			}
			continue // the same container, or one launching or being destroyed
		}
		st := StateRunning
		if f.exit != nil {
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
	live := slices.Collect(maps.Keys(listed))
	for _, x := range l.table.List(true) {
		live = append(live, x.ID) // a launch in flight holds its GPUs
	}
	slices.Sort(live)
	live = slices.Compact(live)
	if l.cfg.ReconcileAllocator {
		if _, err := l.cfg.Allocator.Reconcile(ctx, live); err != nil {
			errs = append(errs, fmt.Errorf("recover: %w", err))
		}
	}
	errs = append(errs, l.sweep(ctx, true, len(errs) > 0), l.sweepDaemons(ctx))
	return l.Containers(), live, errors.Join(errs...)
}

// takeOver makes this Lifecycle's supervisor that of rec's container,
// whose supervisor died: on the runtime's side (Adopter) and as the holder
// of its GPUs, so that a Clean of another process does not take the
// container for a dead one's.
func (l *Lifecycle) takeOver(ctx context.Context, rec Record) (Record, error) {
	sup := *l.cfg.Supervisor
	if a, ok := l.cfg.Runtime.(Adopter); ok {
		r, err := a.Adopt(ctx, rec, sup)
		if err != nil {
			return rec, err
		}
		rec = r
	}
	rec.Supervisor = &sup
	if len(rec.GPUs) == 0 {
		return rec, nil
	}
	return rec, l.cfg.Allocator.SetHolder(ctx, rec.ID, &sup)
}

// unlaunch removes what a launch that did not finish left (a reservation,
// perhaps a container), or an ended container whose supervisor died, and
// gives back what was held for its owner.
func (l *Lifecycle) unlaunch(ctx context.Context, rec Record) error {
	l.log.InfoContext(ctx, "removing a container no one can use", "id", rec.ID, "reserved", rec.Reserved)
	if err := l.cfg.Runtime.Remove(ctx, rec); err != nil {
		return err
	}
	if err := l.release(ctx, rec.ID, rec.VolumeVersion, rec.VolumeVersion == ""); err != nil {
		return err
	}
	return l.unreserve(ctx, rec.ID)
}

// sweepDaemons stops the MPS daemons of owners that hold no memory share
// in the allocator and have no container or launch: daemons whose share
// was released past the Lifecycle (an allocator reconciliation, a holder's
// death), or whose starter was killed. The runtime's containers are listed
// under the daemons' lock, so a launch of another process whose daemon
// runs is listed (its reservation came first).
func (l *Lifecycle) sweepDaemons(ctx context.Context) error {
	if l.cfg.MPS == nil {
		return nil
	}
	var listed map[string]bool
	keep := func(owner string) bool {
		if al, err := l.cfg.Allocator.Allocation(owner); err == nil && al.Share != nil && al.Share.Mode == allocator.ShareMemory {
			return true
		}
		if _, _, err := l.table.Get(owner); err == nil {
			return true
		}
		if listed == nil {
			recs, err := l.cfg.Runtime.List(ctx)
			if err != nil {
				return true // cannot tell: kept
			}
			listed = map[string]bool{}
			for _, r := range recs {
				listed[r.ID] = true
			}
		}
		return listed[owner]
	}
	if stopped, err := l.cfg.MPS.Sweep(ctx, keep); err != nil || len(stopped) > 0 {
		l.log.InfoContext(ctx, "stopped the MPS daemons of released shares", "owners", stopped, "err", err)
		return err
	}
	return nil
}

// sweep has a Cleaner runtime remove its leftovers, after Recover
// (adopting) or Clean.
func (l *Lifecycle) sweep(ctx context.Context, adopting, failed bool) error {
	c, ok := l.cfg.Runtime.(Cleaner)
	if !ok {
		return nil
	}
	if err := c.Sweep(ctx, Sweep{Adopting: adopting, Failed: failed}); err != nil {
		return fmt.Errorf("sweep: %w", err)
	}
	return nil
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
		if al.Holder != nil && al.Holder.Dead("") {
			dead[al.Owner] = true
		}
	}
	records, err := l.cfg.Runtime.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("clean: %w", err)
	}
	var cleaned []string
	var errs []error
	failed := false // a dead supervisor's container is left
	for _, r := range records {
		switch sup := l.supervision(r.Supervisor); {
		case sup == supDead || (r.ID != "" && dead[r.ID]):
			l.log.InfoContext(ctx, "removing a container whose supervisor died", "id", r.ID, "runtime id", r.RuntimeID)
			if err := l.cfg.Runtime.Remove(ctx, r); err != nil {
				failed, errs = true, append(errs, fmt.Errorf("clean %s: %w", r.ID, err))
				continue
			}
			if r.ID == "" {
				continue
			}
			delete(dead, r.ID)
			if err := l.release(ctx, r.ID, r.VolumeVersion, r.VolumeVersion == ""); err != nil {
				failed, errs = true, append(errs, fmt.Errorf("clean %s: %w", r.ID, err))
				continue
			}
			if err := l.unreserve(ctx, r.ID); err != nil {
				failed, errs = true, append(errs, fmt.Errorf("clean %s: %w", r.ID, err))
			}
			cleaned = append(cleaned, r.ID)
		case r.Reserved:
			// A launch in progress: its GPUs are held by its supervisor.
		case sup == supLive && r.Err == nil:
			if err := l.claim(ctx, r, r.Supervisor); err != nil {
				errs = append(errs, fmt.Errorf("clean: container %s: %w", r.RuntimeID, err))
			}
		case sup == supLive:
			errs = append(errs, fmt.Errorf("clean: container %s: %w: %w", r.RuntimeID, ErrNotAdopted, r.Err))
		}
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
