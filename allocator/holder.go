package allocator

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
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
// A Holder is a node.Process, the module's one process identity (the two
// convert: node.Process(h), Holder(p)); its text form is
// node.Process(h).String(), "<pid>.<start>".
type Holder node.Process

func (h Holder) validate() error {
	if !node.Process(h).Valid() {
		return fmt.Errorf("holder pid %d started at %d: %w", h.Pid, h.Start, ErrInvalidRequest)
	}
	return nil
}

// ProcessHolder returns the holder that names the running process pid, as
// the proc file system procRoot ("" means /proc) shows it.
func ProcessHolder(procRoot string, pid int) (Holder, error) {
	st, err := linux.ReadProcStat(procRoot, pid)
	if err != nil {
		return Holder{}, fmt.Errorf("holder %d: %w", pid, err)
	}
	return Holder{Pid: pid, Start: st.Start}, nil
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
func processGone(procRoot string, pid int) bool {
	if _, err := linux.Self(procRoot); err != nil {
		return false
	}
	st, err := linux.ReadProcStat(procRoot, pid)
	if errors.Is(err, fs.ErrNotExist) {
		return true
	}
	return err == nil && st.Exited()
}

// Dead reports whether h's process provably ended: its pid is gone, is a
// zombie, or names a process started at another time. procRoot "" means
// /proc; when it cannot be read, nothing is provably dead.
func (h Holder) Dead(procRoot string) bool {
	return linux.Process(h).Dead(procRoot)
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
		if h.holder != nil && h.holder.Dead(a.cfg.procRoot) {
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

// validHolder checks that h can name a process.
func validHolder(h Holder) error { return h.validate() }
