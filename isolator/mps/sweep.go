package mps

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/node"
)

// List returns the daemons of the manager's directory, by owner, each
// with Alive set. A directory whose record does not read comes as a
// daemon with only Owner and Dir.
func (m *Manager) List(ctx context.Context) ([]Daemon, error) {
	if err := m.made(); err != nil {
		return nil, err
	}
	owners, err := m.owners()
	if err != nil {
		return nil, fmt.Errorf("list MPS daemons: %w", err)
	}
	var out []Daemon
	for _, o := range owners {
		d, err := m.read(o)
		if isNotExist(err) {
			if _, serr := os.Stat(m.daemonDir(o)); serr != nil {
				continue // stopped since
			}
		}
		if err != nil {
			d = m.blank(o)
		}
		out = append(out, d)
	}
	return out, nil
}

// Daemons lists the daemons recorded under dir, a manager's directory, as
// List does, without a manager: it needs no control binary, takes no lock
// and changes nothing (a program that only shows them, say). A directory
// that does not exist holds none.
func Daemons(ctx context.Context, dir string) ([]Daemon, error) {
	if _, err := os.Stat(dir); isNotExist(err) {
		return nil, nil
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("list MPS daemons: %w", err)
	}
	m := &Manager{dir: abs, procRoot: node.DefaultProcRoot, sem: make(chan struct{}, 1)} // made, for List
	return m.List(ctx)
}

// Keep is what explains a daemon, for a sweep (Manager.Sweep, given
// Keep.Keeps): an owner that holds a memory share or a concurrent slice,
// or that a record of the caller's names; and, for the daemon of a GPU's
// concurrent slices (SliceOwner), any allocation that holds a slice of
// that GPU. Every program that sweeps fills it with what it holds: a
// daemon no share and no record explains is stopped.
type Keep struct {
	// Shares is the allocator whose memory shares explain their owners'
	// daemons, and whose concurrent slices their GPUs' daemons (an
	// *allocator.Allocator, whose Shares method Keep reads for a slice
	// daemon); nil means none does.
	Shares Allocations
	// Recorded reports whether a record of the caller's explains owner's
	// daemon (a container, a launch in progress, a prepared claim); one
	// that cannot tell keeps the daemon. Nil means no record does.
	Recorded func(owner string) bool
}

// Allocations is what Keep reads of an allocator: what an owner holds.
type Allocations interface {
	Allocation(owner string) (allocator.Allocation, error)
}

// Keeps reports whether k explains owner's daemon: owner holds a memory
// share or a concurrent slice in k.Shares, or k.Recorded names it; owner
// SliceOwner(uuid) is kept while k.Shares holds any slice of that GPU.
func (k Keep) Keeps(owner string) bool {
	if k.Shares != nil {
		if al, err := k.Shares.Allocation(owner); err == nil && al.Share != nil && (al.Share.Mode == allocator.ShareMemory || al.Share.Mode == allocator.ShareSlice) {
			return true
		}
		if uuid, ok := IsSliceOwner(owner); ok && keepsSlices(k.Shares, uuid) {
			return true
		}
	}
	return k.Recorded != nil && k.Recorded(owner)
}

// Sweep stops every daemon whose owner keep does not keep (Keep.Keeps
// says which a share or a record explains; the daemon of a GPU's slices,
// SliceOwner, is kept while keep keeps its name or one of its tenants, and
// the tenants keep does not keep are dropped from its record), and removes
// what dead daemons of kept owners left (their servers) and what commands
// to daemons left when their process was killed: the recovery of a
// process that lost track of its shares. It returns the owners whose daemons it stopped,
// sorted. A kept owner's dead daemon is not restarted here: Start does
// that.
func (m *Manager) Sweep(ctx context.Context, keep func(owner string) bool) ([]string, error) {
	if err := m.made(); err != nil {
		return nil, err
	}
	var stopped []string
	var errs []error
	err := m.locked(ctx, func() error {
		owners, err := m.owners()
		if err != nil {
			return err
		}
		for _, o := range owners {
			r, err := m.readRecord(o)
			d := r.Daemon
			if err != nil {
				d = m.blank(o)
			}
			kept := keep != nil && keep(o)
			if _, ok := IsSliceOwner(o); ok && err == nil && keep != nil {
				tenants := slices.DeleteFunc(slices.Clone(r.Tenants), func(t string) bool { return !keep(t) })
				if len(tenants) != len(r.Tenants) && (len(tenants) > 0 || kept) {
					if err := m.write(d, tenants); err != nil {
						errs = append(errs, fmt.Errorf("%s: %w", o, err))
					}
				}
				kept = kept || len(tenants) > 0
			}
			if kept {
				if !d.Alive && d.Pid > 0 {
					if err := linux.Reclaim(ctx, m.procRoot, linux.Remains{Marked: daemonMark(d.Mark)}, stopBound); err != nil {
						errs = append(errs, fmt.Errorf("%s: what its dead daemon left: %w", o, daemonErr(err)))
					}
				}
				continue
			}
			if err := m.stop(ctx, d); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", o, err))
				continue
			}
			stopped = append(stopped, o)
		}
		return m.dropControls()
	})
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return stopped, fmt.Errorf("sweep MPS daemons: %w", err)
	}
	return stopped, nil
}

// owners lists the owners with a directory, sorted.
func (m *Manager) owners() ([]string, error) {
	entries, err := os.ReadDir(m.dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if e.IsDir() && node.ValidateOwner(e.Name()) == nil {
			out = append(out, e.Name())
		}
	}
	slices.Sort(out)
	return out, nil
}
