package native

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/node"
)

// Update changes a running container's GPUs to n, in alloc, in the order
// of containerizer.Resize, whose one record of what the container holds is
// the allocator: growing allocates first, records that in the container's
// record, then adds the nodes and the cgroup rules; shrinking keeps the GPUs
// the allocator chooses (healthy first, then by its placement policy),
// denies the others (rules, then nodes), only then frees them, and records
// that. On error the container keeps the GPUs it had, except where
// containerizer.Resize says; the record returned is what the allocator
// holds for it either way. A process killed at any step leaves a container
// that Recover adopts with what the allocator holds, enforced again
// (Repair).
func (r *runner) Update(ctx context.Context, alloc *allocator.Allocator, rec containerizer.Record, n int) (containerizer.Record, error) {
	if n <= 0 {
		return rec, fmt.Errorf("%w: %d GPUs (destroy the container to give all back)", containerizer.ErrInvalidSpec, n)
	}
	pr, err := r.entry(rec.ID)
	if err != nil {
		return rec, err
	}
	pr.busy.Lock()
	defer pr.busy.Unlock()
	select {
	case <-pr.exited: // killed, or ended before the Lifecycle waited for it
		return rec, fmt.Errorf("container has exited: %w", containerizer.ErrNotSupported)
	default:
	}
	step := containerizer.Resize{Allocator: alloc, Owner: rec.ID, Holder: r.holder(), Logger: r.cfg.Logger,
		Enforce: func(ctx context.Context, gpus []node.DeviceRef) error { return r.enforce(ctx, rec.ID, pr, gpus) },
		Commit:  func(al allocator.Allocation) error { return r.commit(pr, al.Devices) },
	}
	_, err = step.To(ctx, n)
	r.mu.Lock()
	rec.GPUs = slices.Clone(pr.rec.GPUs)
	r.mu.Unlock()
	return rec, err
}

// Repair makes rec's container reach what alloc holds for its owner
// (containerizer.Repairer): its device nodes, its cgroup's rules and CPUs,
// then its record, for a container whose process was killed inside an
// update. A container that has exited has nothing to enforce: only its
// record follows.
func (r *runner) Repair(ctx context.Context, alloc *allocator.Allocator, rec containerizer.Record) (containerizer.Record, error) {
	pr, err := r.entry(rec.ID)
	if err != nil {
		return rec, err
	}
	pr.busy.Lock()
	defer pr.busy.Unlock()
	al, err := alloc.Allocation(rec.ID)
	if errors.Is(err, allocator.ErrUnknownOwner) {
		al, err = allocator.Allocation{Owner: rec.ID}, nil
	}
	if err != nil {
		return rec, err
	}
	r.mu.Lock()
	killed := pr.killed
	r.mu.Unlock()
	if rec.Exit == nil && !killed {
		if err := r.enforce(ctx, rec.ID, pr, al.Devices); err != nil {
			return rec, fmt.Errorf("repair %s: %w", rec.ID, err)
		}
	}
	r.mu.Lock()
	same := sameGPUs(pr.rec.GPUs, al.Devices)
	r.mu.Unlock()
	if !same {
		r.cfg.Logger.InfoContext(ctx, "container record follows the allocator", "id", rec.ID, "gpus", len(al.Devices))
		if err := r.commit(pr, al.Devices); err != nil {
			return rec, fmt.Errorf("repair %s: %w", rec.ID, err)
		}
	}
	rec.GPUs = slices.Clone(al.Devices)
	return rec, nil
}

// sameGPUs tells whether a and b name the same devices, in order.
func sameGPUs(a, b []node.DeviceRef) bool {
	return slices.EqualFunc(a, b, func(x, y node.DeviceRef) bool { return x.UUID == y.UUID })
}

// commit records gpus as what the container holds: in memory, then in its
// record on disk.
func (r *runner) commit(pr *proc, gpus []node.DeviceRef) error {
	r.mu.Lock()
	pr.rec.GPUs = slices.Clone(gpus)
	rec := pr.rec
	r.mu.Unlock()
	if err := r.writeRecord(rec); err != nil {
		return fmt.Errorf("record: %w", err)
	}
	return nil
}

// enforce moves the container's isolation to the GPUs gpus. Nodes that
// come are added before the rules widen; rules narrow before nodes go. The
// nodes that go are those of the plan it had and of any enforce that did
// not finish (a failed one may have added its nodes).
func (r *runner) enforce(ctx context.Context, id string, pr *proc, gpus []node.DeviceRef) error {
	r.mu.Lock()
	rec, old, stale := pr.rec, pr.plan, pr.stale
	r.mu.Unlock()
	opts, err := r.planOptions(rec.CPUAffinity)
	if err != nil {
		return err
	}
	plan, err := isolator.NewPlan(id, r.cfg.Inventory, gpus, rec.Mounts, rec.Env, opts...)
	if err != nil {
		return err
	}
	r.mu.Lock()
	pr.stale = append(slices.Clone(stale), plan.Devices...)
	r.mu.Unlock()
	dev := r.devDir(id)
	for _, d := range plan.Devices {
		if err := r.dev.addNode(dev, d); err != nil {
			return err
		}
	}
	r.cfg.Logger.DebugContext(ctx, "update", "step", "nodes added", "id", id)
	if err := r.cfg.Isolator.Apply(ctx, id, plan.Rules); err != nil {
		return err
	}
	r.cfg.Logger.DebugContext(ctx, "update", "step", "rules applied", "id", id)
	if old == nil || plan.CPUs != old.CPUs || plan.Mems != old.Mems {
		// The CPUs local to the GPUs it has now.
		if err := r.pin(ctx, id, plan); err != nil {
			return err
		}
	}
	var gone []isolator.DeviceNode
	if old != nil {
		gone = append(gone, old.Devices...)
	}
	for _, d := range append(gone, stale...) {
		if slices.Contains(plan.Devices, d) {
			continue
		}
		if err := r.dev.removeNode(dev, d); err != nil {
			return err
		}
	}
	r.cfg.Logger.DebugContext(ctx, "update", "step", "nodes removed", "id", id)
	r.mu.Lock()
	pr.plan, pr.stale = plan, nil
	r.mu.Unlock()
	return nil
}
