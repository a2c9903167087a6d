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

// Update changes a running container's GPUs to n. Growing allocates first,
// then adds the nodes and the cgroup rules; shrinking keeps the GPUs the
// allocator chooses (healthy first, then by its placement policy), denies the
// others (rules, then nodes) and only then
// frees them. On error the container keeps the GPUs it had.
func (c *Containerizer) Update(ctx context.Context, id string, n int) (containerizer.Container, error) {
	ct, err := c.get(id)
	if err != nil {
		return containerizer.Container{}, fmt.Errorf("update %s: %w", id, err)
	}
	ct.busy.Lock()
	defer ct.busy.Unlock()
	if err := c.update(ctx, id, ct, n); err != nil {
		return containerizer.Container{}, fmt.Errorf("update %s to %d gpus: %w", id, n, err)
	}
	return c.describe(id, ct), nil
}

func (c *Containerizer) update(ctx context.Context, id string, ct *container, n int) error {
	_, st, _ := c.containers.Get(id)
	c.mu.Lock()
	running, have := st == containerizer.StateRunning, slices.Clone(ct.rec.GPUs)
	c.mu.Unlock()
	if !running {
		return fmt.Errorf("container has exited: %w", containerizer.ErrNotSupported)
	}
	if n <= 0 {
		return fmt.Errorf("%w: %d GPUs (destroy the container to give all back)", containerizer.ErrInvalidSpec, n)
	}
	switch {
	case n == len(have):
		return nil
	case n > len(have):
		// A container launched without GPUs holds nothing yet.
		grow := func() (allocator.Allocation, error) { return c.cfg.Allocator.Resize(ctx, id, n) }
		if len(have) == 0 {
			grow = func() (allocator.Allocation, error) {
				return c.cfg.Allocator.Allocate(ctx, id, allocator.Request{Count: n})
			}
		}
		al, err := grow()
		if err != nil {
			return err
		}
		if err := c.enforce(ctx, id, ct, al.Devices, have); err != nil {
			if len(have) == 0 {
				c.cfg.Allocator.Release(context.WithoutCancel(ctx), id)
			} else {
				c.cfg.Allocator.Retain(context.WithoutCancel(ctx), id, uuids(have))
			}
			return err
		}
	default:
		keep, err := c.cfg.Allocator.Shrink(id, n)
		if err != nil {
			return err
		}
		if err := c.enforce(ctx, id, ct, keep, have); err != nil {
			return err
		}
		if _, err := c.cfg.Allocator.Retain(ctx, id, uuids(keep)); err != nil {
			// Still allocated: give the container its GPUs back.
			c.enforce(context.WithoutCancel(ctx), id, ct, have, keep)
			return err
		}
	}
	return nil
}

// enforce moves the container's isolation from the GPUs old to gpus. Nodes
// that come are added before the rules widen; rules narrow before nodes go.
func (c *Containerizer) enforce(ctx context.Context, id string, ct *container, gpus, old []node.DeviceRef) error {
	plan, err := isolator.NewPlan(id, c.cfg.Inventory, gpus, ct.rec.Mounts, ct.rec.Env)
	if err != nil {
		return err
	}
	dev := c.devDir(id)
	for _, d := range plan.Devices {
		if err := c.dev.addNode(dev, d); err != nil {
			return err
		}
	}
	if err := c.cfg.Isolator.Apply(ctx, id, plan.Rules); err != nil {
		return err
	}
	for _, d := range ct.plan.Devices {
		if !slices.Contains(plan.Devices, d) {
			if err := c.dev.removeNode(dev, d); err != nil {
				return err
			}
		}
	}
	rec := ct.rec
	rec.GPUs = gpus
	if err := writeJSON(c.recPath(id), rec); err != nil {
		return fmt.Errorf("record: %w", err)
	}
	c.mu.Lock()
	ct.rec, ct.plan = rec, plan
	c.mu.Unlock()
	return nil
}

func uuids(refs []node.DeviceRef) []string {
	out := make([]string, len(refs))
	for i, r := range refs {
		out[i] = r.UUID
	}
	return out
}
