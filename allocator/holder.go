package allocator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"

	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/node"
)

// Holder is what proves an owner alive: a process, named by its pid and
// its start time (field 22 of /proc/<pid>/stat, clock ticks since boot),
// which tells it from a later process given the same pid. An owner whose
// holder is provably dead (no such pid, another start time, or a zombie)
// is released by ReleaseDead; an owner without a holder, or whose holder
// cannot be checked, never is.
//
// Holders are checked in the proc file system of the allocator (see
// WithProcRoot): every process sharing a state directory must be in the
// same pid namespace.
//
// A Holder is a node.Process, the module's one process identity (an
// alias: the two are one type); its text form is h.String(),
// "<pid>.<start>".
type Holder = node.Process

// validHolder checks that h can name a process.
func validHolder(h Holder) error {
	if !h.Valid() {
		return fmt.Errorf("holder pid %d started at %d: %w", h.Pid, h.Start, ErrInvalidRequest)
	}
	return nil
}

// ProcessHolder returns the holder that names the running process pid, as
// the proc file system procRoot ("" means /proc) shows it.
func ProcessHolder(procRoot string, pid int) (Holder, error) {
	h, err := linux.ProcessOf(procRoot, pid)
	if err != nil {
		return Holder{}, fmt.Errorf("holder %d: %w", pid, err)
	}
	return h, nil
}

// WithProcRoot sets the proc file system holders are checked in (default
// /proc).
func WithProcRoot(dir string) Option {
	return func(s *settings) error {
		if dir == "" {
			return errors.New("empty proc root")
		}
		s.procRoot = dir
		return nil
	}
}

// processGone reports whether pid provably does not run.
func processGone(procRoot string, pid int) bool { return linux.PidGone(procRoot, pid) }

// HolderDead reports whether h's process provably ended: its pid is gone,
// is a zombie, or names a process started at another time. procRoot ""
// means /proc; when it cannot be read, nothing is provably dead. It was
// the method Holder.Dead, which went when Holder became node.Process.
func HolderDead(procRoot string, h Holder) bool {
	return linux.Dead(procRoot, h)
}

// ReleaseDead releases every owner whose holder is provably dead, in one
// change on disk before it returns, and returns those owners, sorted.
// Owners without a holder are kept.
//
// A caller that isolates the owners (cgroups, containers) should first make
// sure their processes are gone: a holder that died leaving its container
// running would otherwise have its GPUs handed out while still in use.
func (a *Allocator) ReleaseDead(ctx context.Context) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("release dead owners: %w", err)
	}
	unlock, err := a.lock(ctx)
	if err != nil {
		return nil, fmt.Errorf("release dead owners: %w", err)
	}
	defer unlock()
	gone := map[string]*holding{}
	for o, h := range a.owners {
		if h.holder != nil && linux.Dead(a.cfg.procRoot, *h.holder) {
			gone[o] = h
		}
	}
	if len(gone) == 0 {
		return nil, nil
	}
	released := make([]string, 0, len(gone))
	for o := range gone {
		a.apply(o, nil)
		released = append(released, o)
	}
	sort.Strings(released)
	err = a.persist(ctx, func() {
		for o, h := range gone {
			a.apply(o, h)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("release dead owners: %w", err)
	}
	a.cfg.logger.Info("released owners whose holder died", "owners", released)
	return slices.Clip(released), nil
}
