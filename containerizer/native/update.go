package native

import (
	"context"
	"fmt"
	"slices"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/node"
)

// Update changes a running container's GPUs to n, in alloc. Growing allocates first,
// then adds the nodes and the cgroup rules; shrinking keeps the GPUs the
// allocator chooses (healthy first, then by its placement policy), denies the
// others (rules, then nodes) and only then
// frees them. On error the container keeps the GPUs it had.
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
	if err := r.update(ctx, alloc, rec.ID, pr, n); err != nil {
		return rec, err
	}
	r.mu.Lock()
	rec.GPUs = slices.Clone(pr.rec.GPUs)
	r.mu.Unlock()
	return rec, nil
}

// update is the one grow/shrink step (containerizer.Resize) over the
// container's nodes and rules (enforce).
func (r *runner) update(ctx context.Context, alloc *allocator.Allocator, id string, pr *proc, n int) error {
	step := containerizer.Resize{Allocator: alloc, Owner: id, Holder: r.holder(),
		Enforce: func(ctx context.Context, gpus []node.DeviceRef) error { return r.enforce(ctx, id, pr, gpus) },
	}
	_, err := step.To(ctx, n)
	return err
}

// enforce moves the container's isolation from the GPUs old to gpus. Nodes
// that come are added before the rules widen; rules narrow before nodes go.
func (r *runner) enforce(ctx context.Context, id string, pr *proc, gpus []node.DeviceRef) error {
	r.mu.Lock()
	rec, old := pr.rec, pr.plan
	r.mu.Unlock()
	opts, err := r.planOptions(rec.CPUAffinity)
	if err != nil {
		return err
	}
	plan, err := isolator.NewPlan(id, r.cfg.Inventory, gpus, rec.Mounts, rec.Env, opts...)
	if err != nil {
		return err
	}
	dev := r.devDir(id)
	for _, d := range plan.Devices {
		if err := r.dev.addNode(dev, d); err != nil {
			return err
		}
	}
	if err := r.cfg.Isolator.Apply(ctx, id, plan.Rules); err != nil {
		return err
	}
	if plan.CPUs != old.CPUs || plan.Mems != old.Mems {
		// The CPUs local to the GPUs it has now.
		if err := r.pin(ctx, id, plan); err != nil {
			return err
		}
	}
	for _, d := range old.Devices {
		if !slices.Contains(plan.Devices, d) {
			if err := r.dev.removeNode(dev, d); err != nil {
				return err
			}
		}
	}
	rec.GPUs = gpus
	if err := r.writeRecord(rec); err != nil {
		return fmt.Errorf("record: %w", err)
	}
	r.mu.Lock()
	pr.rec, pr.plan = rec, plan
	r.mu.Unlock()
	return nil
}
