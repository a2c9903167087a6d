package allocator

import (
	"context"
	"fmt"

	"github.com/gpuiso/gpuiso/internal/linux"
)

// A state directory may be shared by any number of allocators, in one
// process or many (on Linux): every change takes the directory's lock
// (flock on LockFile, a file no other user can open: lock.go), reads the
// state file again when another allocator changed it since, applies,
// writes the file atomically and lets go. Reads
// (Allocation, Allocations, Owners, Free, Devices) take no lock: they pick
// up the last complete state file, which a rename replaces whole.
//
// Elsewhere than on Linux the lock is not available: the directory then
// serves one allocator at a time.

// lock takes the allocator's mutex, then the state directory's lock with
// the state reloaded (lockState); unlock gives both back. The wait for the
// directory's lock ends with ctx, in a *LockError naming the holder.
func (a *Allocator) lock(ctx context.Context) (unlock func(), err error) {
	a.mu.Lock()
	unlockState, err := a.lockState(ctx)
	if err != nil {
		a.mu.Unlock()
		return nil, err
	}
	return func() {
		unlockState()
		a.mu.Unlock()
	}, nil
}

// lockState takes the state directory's lock and brings memory up to date
// with the state file. The caller holds a.mu and calls the returned unlock
// when its change is on disk.
func (a *Allocator) lockState(ctx context.Context) (unlock func(), err error) {
	if a.store == nil || a.store.held > 0 {
		return func() {}, nil // no directory, or Exclusive holds it
	}
	locked, err := a.store.lockStore(ctx)
	if err != nil {
		return nil, err
	}
	unlock = func() {
		if locked {
			_ = linux.Unlock(a.store.lockFile)
		}
	}
	if err := a.reload(false); err != nil {
		unlock()
		return nil, err
	}
	return unlock, nil
}

// Exclusive runs fn while this allocator holds the state directory's lock:
// no allocator of another process changes the state meanwhile, so fn can
// bring the state in line with something outside it (a container daemon's
// containers, say) and act on it as one step. The allocator's own methods
// may be called from fn; other allocators on the directory (in this process
// or another) wait. Without a state directory fn simply runs.
func (a *Allocator) Exclusive(ctx context.Context, fn func() error) error {
	if a.inv == nil {
		return ErrNotMade
	}
	if fn == nil {
		return fmt.Errorf("exclusive: nil function: %w", ErrInvalidRequest)
	}
	a.mu.Lock()
	unlock, err := a.lockState(ctx)
	if err != nil {
		a.mu.Unlock()
		return fmt.Errorf("exclusive: %w", err)
	}
	if a.store != nil {
		a.store.held++
	}
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		if a.store != nil {
			a.store.held--
		}
		unlock()
		a.mu.Unlock()
	}()
	return fn()
}

// refresh brings memory up to date with the state file for a read; on an
// error the last good view stays. The caller holds a.mu.
func (a *Allocator) refresh() {
	if a.store != nil {
		_ = a.reload(false)
	}
}

// reload replaces the allocator's view with the state file when the file
// changed since this allocator last read or wrote it. Only the first load
// (New) keeps its warnings.
func (a *Allocator) reload(first bool) error {
	st, b, changed, err := a.store.changed()
	if err != nil || !changed {
		return err
	}
	warnings := a.warnings
	a.reset()
	if st != nil {
		if err := a.restore(st); err != nil {
			a.reset()
			a.store.known = false
			return &StateError{File: a.store.path(), Err: err}
		}
	}
	if !first {
		a.warnings = warnings
	}
	a.store.seen(b)
	return nil
}

// reset empties the allocator: no owners, configured shares only, the
// inventory's health.
func (a *Allocator) reset() {
	a.owners = map[string]*holding{}
	for p := range a.n {
		a.exclusive[p] = ""
		a.shares[p] = nil
		if a.shareCfg&(1<<p) != 0 {
			a.shares[p] = map[string]uint64{}
		}
		a.health[p] = a.inv.Devices[p].Health
	}
	clear(a.mig.shares)
	for k := range a.mig.owner {
		a.mig.owner[k] = ""
	}
}

// Close lets go of the state directory. An allocator without one has
// nothing to close; a closed allocator must not be used again.
func (a *Allocator) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.store == nil || a.store.lockFile == nil {
		return nil
	}
	err := a.store.close()
	a.store.lockFile = nil
	return err
}

// open loads the state directory for New without waiting for its lock:
// when the lock is free it removes what dead writers left and reads the
// state file under it; when another process holds it, it reads the last
// complete state file, as reads do, and leaves the clean-up to a later New.
func (a *Allocator) open() error {
	if a.store.tryLockStore() {
		defer linux.Unlock(a.store.lockFile)
		a.store.removeStale()
	}
	return a.reload(true)
}
