package native

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/node"
)

// List returns a record per container directory of the state directory,
// with its supervisor (supervisor.json) and its record (container.json):
//
//   - a directory without a record is a reservation (Record.Reserved): a
//     launch in progress, or one its supervisor did not finish;
//   - a record that does not read (records are not synced: a machine crash
//     can leave one empty) comes with Err while its cgroup holds a process,
//     and is a reservation, which the recoveries remove, once it holds none;
//   - a container whose init recorded its exit, or is no longer running
//     (same pid, same start time), has exited.
func (r *runner) List(ctx context.Context) ([]containerizer.Record, error) {
	entries, err := os.ReadDir(r.cfg.StateDir)
	if err != nil {
		return nil, fmt.Errorf("list: %w", err)
	}
	var out []containerizer.Record
	for _, e := range entries {
		id := e.Name()
		if !e.IsDir() || node.ValidateOwner(id) != nil {
			continue
		}
		var sup *allocator.Holder
		if h, err := r.readSupervisor(id); err == nil {
			sup = &h
		} else if _, serr := os.Stat(r.dir(id)); errors.Is(serr, fs.ErrNotExist) {
			continue // removed since the listing
		}
		// A directory an older version made names no supervisor.
		out = append(out, r.listOne(ctx, id, sup))
	}
	return out, nil
}

func (r *runner) listOne(ctx context.Context, id string, sup *allocator.Holder) containerizer.Record {
	rec, err := r.readRecord(id)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return containerizer.Record{ID: id, Supervisor: sup, Reserved: true}
	case torn(err):
		if procs, perr := r.cfg.Isolator.Processes(ctx, id); perr == nil && len(procs) > 0 {
			return containerizer.Record{ID: id, RuntimeID: id, Supervisor: sup, Err: err}
		}
		r.cfg.Logger.Info("a container whose record is unreadable and whose cgroup is empty is gone", "id", id, "err", err)
		return containerizer.Record{ID: id, Supervisor: sup, Reserved: true}
	case err != nil:
		// Whole, but not a record this containerizer can trust (another
		// version's, another container's, a failed checksum).
		return containerizer.Record{ID: id, RuntimeID: id, Supervisor: sup, Err: err}
	}
	out := r.public(rec)
	out.Supervisor = sup
	if ex, err := r.readExit(id); err == nil {
		out.Exit = &containerizer.ExitStatus{Code: ex.Code}
	} else if !alive(r.cfg.ProcRoot, rec.Pid, rec.Start) {
		out.Exit = &containerizer.ExitStatus{Code: 128 + linux.SignalKill}
	}
	return out
}

// Sweep removes what no container explains: the directories of claims
// that dead processes left half made or half removed; after Clean (and
// when it dealt with every container) the TempDir directories of dead
// processes, whose containers are gone; after Recover the cgroups no
// record explains, only in the state directory's own cgroup parent (see
// Config.Isolator), and only its direct children that are no parent of
// cgroups themselves: it never signals or removes a process or cgroup of
// another containerizer, nor waits on one. Then the parent itself, if
// nothing is left in it.
func (r *runner) Sweep(ctx context.Context, s containerizer.Sweep) error {
	// Cgroups are listed before directories: a container's directory is
	// made before its cgroup and removed after it, so a cgroup listed here
	// whose directory is missing below is truly no one's.
	var owners []string
	var errs []error
	if s.Adopting && r.parent != nil {
		var err error
		if owners, err = r.cfg.Isolator.Owners(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	entries, err := os.ReadDir(r.cfg.StateDir)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	seen := map[string]bool{}
	for _, e := range entries {
		name := e.Name()
		seen[name] = true
		remove := r.deadClaim(name) || (!s.Adopting && !s.Failed && r.deadTemp(name))
		if !remove {
			continue
		}
		r.cfg.Logger.Info("removing what a dead process left", "dir", name)
		if err := os.RemoveAll(filepath.Join(r.cfg.StateDir, name)); err != nil {
			errs = append(errs, err)
		}
	}
	for _, id := range owners {
		if seen[id] || r.known(id) != nil {
			continue
		}
		r.cfg.Logger.Info("removing a cgroup no container record explains", "id", id)
		if err := r.destroyCgroup(ctx, id); err != nil {
			errs = append(errs, fmt.Errorf("orphan cgroup %s: %w", id, err))
		}
	}
	r.removeParent() // if nothing is left in it
	return errors.Join(errs...)
}
