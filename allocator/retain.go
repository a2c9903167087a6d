package allocator

import (
	"context"
	"fmt"
	"math/bits"

	"github.com/gpuiso/gpuiso/node"
)

// Retain shrinks owner's exclusive allocation to keep, a non-empty subset of
// the GPUs it holds (indexes, UUIDs or bus ids), and frees the rest.
//
// Unlike Resize, the caller chooses what stays: an isolator can first deny
// the container the GPUs that go, and only then free them, so that no GPU is
// ever reachable from two containers.
func (a *Allocator) Retain(ctx context.Context, owner string, keep []string) (Allocation, error) {
	if a.inv == nil {
		return Allocation{}, ErrNotMade
	}
	al, err := a.retain(ctx, owner, keep)
	if err != nil {
		return Allocation{}, fmt.Errorf("retain %d gpus for %s: %w", len(keep), owner, err)
	}
	return al, nil
}

func (a *Allocator) retain(ctx context.Context, owner string, keep []string) (Allocation, error) {
	if err := ctx.Err(); err != nil {
		return Allocation{}, err
	}
	if len(keep) == 0 {
		return Allocation{}, fmt.Errorf("nothing to keep (use Release): %w", ErrInvalidRequest)
	}
	unlock, err := a.lock(ctx)
	if err != nil {
		return Allocation{}, err
	}
	defer unlock()
	h, ok := a.owners[owner]
	if !ok {
		return Allocation{}, ErrUnknownOwner
	}
	if _, migShare := h.migShare(); h.shared >= 0 || migShare {
		return Allocation{}, fmt.Errorf("shared allocation: %w", ErrInvalidRequest)
	}
	if len(h.mig) > 0 {
		return Allocation{}, fmt.Errorf("MIG allocation: %w", ErrInvalidRequest)
	}
	var set uint64
	for _, ref := range keep {
		p, err := a.resolve(ref)
		if err != nil {
			return Allocation{}, err
		}
		if set&(1<<p) != 0 {
			return Allocation{}, fmt.Errorf("%s: %w", ref, ErrDuplicateDevice)
		}
		if h.devices&(1<<p) == 0 {
			return Allocation{}, fmt.Errorf("%s is not held by %s: %w", ref, owner, ErrInvalidRequest)
		}
		set |= 1 << p
	}
	next := &holding{group: h.group, devices: set, shared: -1, holder: h.holder}
	a.apply(owner, next)
	if err := a.persist(ctx, func() { a.apply(owner, h) }); err != nil {
		return Allocation{}, err
	}
	return a.allocation(owner, next), nil
}

// Shrink returns the count GPUs of owner's exclusive allocation that a
// shrink to count keeps, chosen as Resize chooses: healthy GPUs first, then
// by the allocator's placement policy (so NVLink groups stay whole under the
// topology policy). It changes nothing: a caller that must deny the GPUs
// that go before they are freed does so, then calls Retain with the result.
func (a *Allocator) Shrink(owner string, count int) ([]node.DeviceRef, error) {
	if a.inv == nil {
		return nil, ErrNotMade
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	h, ok := a.owners[owner]
	switch {
	case !ok:
		return nil, fmt.Errorf("shrink %s: %w", owner, ErrUnknownOwner)
	case h.shared >= 0:
		return nil, fmt.Errorf("shrink %s: shared allocation: %w", owner, ErrInvalidRequest)
	case count <= 0 || count > bits.OnesCount64(h.devices):
		return nil, fmt.Errorf("shrink %s to %d of %d gpus: %w", owner, count, bits.OnesCount64(h.devices), ErrInvalidRequest)
	}
	var out []node.DeviceRef
	for _, p := range a.positions(a.shrinkSet(h.devices, count)) {
		out = append(out, a.inv.Devices[p].Ref())
	}
	return out, nil
}
