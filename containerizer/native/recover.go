package native

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/node"
)

// Recover rebuilds the containerizer's view after a restart from what the
// state directory and the kernel hold. A container whose init still runs
// (same pid, same start time) and whose cgroup exists is re-adopted with its
// GPUs: re-allocated by identity if the allocator has lost them. Any other
// is torn down and its GPUs released. Cgroups no record explains are
// removed only in the state directory's own cgroup parent (see
// Config.Isolator), and only its direct children that are no parent of
// cgroups themselves: Recover never signals or removes a process or cgroup
// of another containerizer, nor waits on one. Each cgroup's removal is
// bounded in time. It returns the re-adopted containers. Errors are
// joined: one container that cannot be recovered does not stop the others.
func (c *Containerizer) Recover(ctx context.Context) ([]containerizer.Container, error) {
	if c.prep == nil {
		return nil, fmt.Errorf("recover: %w", containerizer.ErrNotMade)
	}
	// Cgroups are listed before directories: a container's directory is
	// made before its cgroup and removed after it, so a cgroup listed here
	// whose directory is missing below is truly no one's.
	owners, ownersErr := c.cfg.Isolator.Owners(ctx)
	entries, err := os.ReadDir(c.cfg.StateDir)
	if err != nil {
		return nil, fmt.Errorf("recover: %w", err)
	}
	var adopted []containerizer.Container
	var errs []error
	seen := map[string]bool{}
	var others []string
	for _, e := range entries {
		id := e.Name()
		if c.deadClaim(id) {
			if err := os.RemoveAll(filepath.Join(c.cfg.StateDir, id)); err != nil {
				errs = append(errs, fmt.Errorf("recover: %w", err))
			}
			continue
		}
		if !e.IsDir() || node.ValidateOwner(id) != nil {
			continue
		}
		seen[id] = true
		if _, err := c.get(id); err == nil {
			continue // already known to this process
		}
		if c.supervisedElsewhere(id) {
			others = append(others, id) // a live process's container
			continue
		}
		ct, err := c.recoverOne(ctx, id)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("recover %s: %w", id, err))
		case ct != nil:
			adopted = append(adopted, c.describe(id, ct))
		}
	}
	if ownersErr != nil {
		errs = append(errs, fmt.Errorf("recover: %w", ownersErr))
	}
	if c.parent == nil {
		owners = nil // a parent other containerizers may share
	}
	for _, id := range owners {
		if !seen[id] {
			if _, err := c.get(id); errors.Is(err, containerizer.ErrUnknownContainer) {
				c.cfg.Logger.Info("removing a cgroup no container record explains", "id", id)
				if err := c.destroyCgroup(ctx, id); err != nil {
					errs = append(errs, fmt.Errorf("recover: orphan cgroup %s: %w", id, err))
				}
			}
		}
	}
	c.removeParent() // if nothing is left in it
	if c.cfg.ReconcileAllocator {
		live := slices.Clone(others)
		for _, ct := range c.Containers() {
			live = append(live, ct.ID)
		}
		res, err := c.cfg.Allocator.Reconcile(ctx, live)
		if err != nil {
			errs = append(errs, fmt.Errorf("recover: %w", err))
		} else if len(res.Released) > 0 {
			c.cfg.Logger.Info("released allocations of containers that are gone", "owners", res.Released)
		}
	}
	return adopted, errors.Join(errs...)
}

// recoverOne re-adopts container id, or tears it down when it is gone; it
// returns nil, nil for a container torn down.
func (c *Containerizer) recoverOne(ctx context.Context, id string) (*container, error) {
	var rec record
	err := readJSON(c.recPath(id), &rec)
	if errors.Is(err, fs.ErrNotExist) {
		// Crashed between its state directory and its first record.
		return nil, c.teardown(ctx, id, record{ID: id})
	}
	if err != nil {
		// Unreadable: a machine crash can leave a record empty (records
		// are not synced). With no process left in its cgroup, the
		// container is gone; otherwise nothing is touched.
		if procs, perr := c.cfg.Isolator.Processes(ctx, id); perr == nil && len(procs) > 0 {
			return nil, err
		}
		c.cfg.Logger.Info("cleaning up a container whose record is unreadable and whose cgroup is empty", "id", id, "err", err)
		return nil, c.teardown(ctx, id, record{ID: id})
	}
	if rec.Version != recordVersion || rec.ID != id {
		return nil, fmt.Errorf("record %s: version %d, id %q: not a record this containerizer wrote", c.recPath(id), rec.Version, rec.ID)
	}
	procs, perr := c.cfg.Isolator.Processes(ctx, id)
	_, exitErr := os.Stat(c.exitPath(id)) // the command's exit is recorded
	if exitErr == nil || !alive(c.cfg.ProcRoot, rec.Pid, rec.Start) || perr != nil || !slices.Contains(procs, rec.Pid) {
		c.cfg.Logger.Info("cleaning up a container that did not survive", "id", id)
		return nil, c.teardown(ctx, id, rec)
	}
	if err := c.reclaim(ctx, rec); err != nil {
		return nil, err
	}
	plan, err := isolator.NewPlan(id, c.cfg.Inventory, rec.GPUs, rec.Mounts, rec.Env)
	if err != nil {
		return nil, err
	}
	if err := writeJSON(c.supPath(id), c.self); err != nil {
		return nil, fmt.Errorf("adopt: %w", err)
	}
	ct := &container{rec: rec, plan: plan, exited: make(chan struct{})}
	if err := c.containers.Adopt(id, containerizer.StateRunning, ct); err != nil {
		return nil, err
	}
	go c.watch(id, ct)
	c.cfg.Logger.Info("container re-adopted", "id", id, "pid", rec.Pid, "gpus", len(rec.GPUs))
	return ct, nil
}

// reclaim makes the allocator agree that the container owns its GPUs.
func (c *Containerizer) reclaim(ctx context.Context, rec record) error {
	_, err := c.cfg.Allocator.Claim(ctx, rec.ID, rec.GPUs)
	return err
}
