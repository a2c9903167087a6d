package allocator

import (
	"context"
	"fmt"
	"sort"
)

// ReconcileResult says what Reconcile did.
type ReconcileResult struct {
	// Released are the owners the state held that are no longer alive.
	Released []string
	// Kept are the live owners whose allocations were restored.
	Kept []string
	// Unknown are live owners the state holds nothing for: their GPUs must
	// be found another way (for instance from their cgroups) and allocated
	// again with explicit devices.
	Unknown []string
}

// Reconcile makes the allocator agree with the owners the isolators still
// see alive, after a crash or restart: every other owner is released, in
// one change that is on disk before Reconcile returns. With a state
// directory shared by several processes, live must name every process's
// live owners (or use ReleaseDead, which needs no such list).
func (a *Allocator) Reconcile(ctx context.Context, live []string) (ReconcileResult, error) {
	if a.inv == nil {
		return ReconcileResult{}, ErrNotMade
	}
	var res ReconcileResult
	if err := ctx.Err(); err != nil {
		return res, fmt.Errorf("reconcile: %w", err)
	}
	alive := map[string]bool{}
	for _, o := range live {
		alive[o] = true
	}
	unlock, err := a.lock(ctx)
	if err != nil {
		return res, fmt.Errorf("reconcile: %w", err)
	}
	defer unlock()
	gone := map[string]*holding{}
	for o, h := range a.owners {
		if alive[o] {
			res.Kept = append(res.Kept, o)
		} else {
			gone[o] = h
			res.Released = append(res.Released, o)
		}
	}
	for o := range alive {
		if a.owners[o] == nil {
			res.Unknown = append(res.Unknown, o)
		}
	}
	sort.Strings(res.Released)
	sort.Strings(res.Kept)
	sort.Strings(res.Unknown)
	if len(gone) == 0 {
		return res, nil
	}
	for o := range gone {
		a.apply(o, nil)
	}
	undo := func() {
		for o, h := range gone {
			a.apply(o, h)
		}
	}
	if err := a.persist(ctx, undo); err != nil {
		return ReconcileResult{}, fmt.Errorf("reconcile: %w", err)
	}
	for _, h := range gone {
		a.releaseDynamic(ctx, h)
	}
	a.cfg.logger.Info("reconciled", "released", res.Released, "kept", len(res.Kept), "unknown", res.Unknown)
	return res, nil
}
