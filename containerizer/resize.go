package containerizer

import (
	"context"
	"errors"
	"fmt"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/node"
)

// Resize is the one grow/shrink step of a live container's whole GPUs,
// which every runtime's update and the chain isolator's run: the order of
// its calls keeps any GPU from being reachable from two containers. A grow
// allocates first (allocator.Allocator.Allocate for an owner that holds
// nothing, Resize otherwise), then enforces; a shrink has the allocator
// choose what stays (Shrink), enforces that (the GPUs that go are denied),
// and only then releases the rest (Retain, or Release for none). When a
// step after the allocator's change fails, the change is undone: the owner
// holds, and the container is allowed, what it had.
type Resize struct {
	// Allocator holds the GPUs.
	Allocator *allocator.Allocator
	// Owner is the container's owner id in the allocator.
	Owner string
	// Holder is the holder of a first allocation (an owner that held
	// nothing grows); nil means none.
	Holder *allocator.Holder
	// Enforce makes the container reach exactly gpus: its device nodes,
	// device rules and CPUs. It is called once with the new GPUs and, when
	// a later step fails, again with the old.
	Enforce func(ctx context.Context, gpus []node.DeviceRef) error
	// Commit, when set, records what the owner holds once the allocator
	// changed: on a grow after the allocation (before Enforce), on a
	// shrink after the release; again with the old holding when the
	// change is undone.
	Commit func(al allocator.Allocation) error
}

// To changes what the owner holds to n whole GPUs (0: none) and returns
// what it holds afterwards. On error it holds what it held before, as far
// as undoing allows (the errors of the undo are joined), with one
// exception: a shrink whose Commit fails after the release is not undone
// (the released GPUs may be another's by then, and are denied already):
// To returns the smaller allocation the owner now holds with the error,
// and the record is the caller's to bring in line (the allocator is the
// record a recovery trusts).
func (r Resize) To(ctx context.Context, n int) (allocator.Allocation, error) {
	if r.Allocator == nil || r.Enforce == nil || n < 0 {
		return allocator.Allocation{}, fmt.Errorf("resize %s to %d gpus: %w", r.Owner, n, node.ErrInvalid)
	}
	cur, err := r.Allocator.Allocation(r.Owner)
	if errors.Is(err, allocator.ErrUnknownOwner) {
		cur, err = allocator.Allocation{Owner: r.Owner}, nil
	}
	if err != nil {
		return allocator.Allocation{}, err
	}
	have := len(cur.Devices)
	if n == have {
		return cur, nil
	}
	if n < have {
		return r.shrink(ctx, cur, n)
	}
	return r.grow(ctx, cur, n)
}

func (r Resize) grow(ctx context.Context, cur allocator.Allocation, n int) (allocator.Allocation, error) {
	var next allocator.Allocation
	var err error
	if len(cur.Devices) == 0 {
		next, err = r.Allocator.Allocate(ctx, r.Owner, allocator.Request{Count: n, Holder: r.Holder})
	} else {
		next, err = r.Allocator.Resize(ctx, r.Owner, n)
	}
	if err != nil {
		return allocator.Allocation{}, err
	}
	if err = r.commit(next); err == nil {
		err = r.Enforce(ctx, next.Devices)
	}
	if err != nil {
		// Back to what it held: the new GPUs were never allowed.
		bg := context.WithoutCancel(ctx)
		var undo error
		if len(cur.Devices) == 0 {
			undo = r.Allocator.Release(bg, r.Owner)
		} else {
			_, undo = r.Allocator.Retain(bg, r.Owner, refUUIDs(cur.Devices))
		}
		return allocator.Allocation{}, errors.Join(err, undo, r.commit(cur))
	}
	return next, nil
}

func (r Resize) shrink(ctx context.Context, cur allocator.Allocation, n int) (allocator.Allocation, error) {
	var keep []node.DeviceRef
	if n > 0 {
		var err error
		if keep, err = r.Allocator.Shrink(r.Owner, n); err != nil {
			return allocator.Allocation{}, err
		}
	}
	if err := r.Enforce(ctx, keep); err != nil {
		return allocator.Allocation{}, errors.Join(err, r.reallow(ctx, cur))
	}
	next := allocator.Allocation{Owner: r.Owner}
	var err error
	if n == 0 {
		err = r.Allocator.Release(ctx, r.Owner)
	} else {
		next, err = r.Allocator.Retain(ctx, r.Owner, refUUIDs(keep))
	}
	if err != nil {
		// The GPUs stay held: allow them again.
		return allocator.Allocation{}, errors.Join(err, r.reallow(ctx, cur))
	}
	if err := r.commit(next); err != nil {
		return next, fmt.Errorf("resize %s to %d gpus: done, not recorded: %w", r.Owner, n, err)
	}
	return next, nil
}

// reallow allows the container the GPUs it held before a shrink.
func (r Resize) reallow(ctx context.Context, cur allocator.Allocation) error {
	return r.Enforce(context.WithoutCancel(ctx), cur.Devices)
}

func (r Resize) commit(al allocator.Allocation) error {
	if r.Commit == nil {
		return nil
	}
	return r.Commit(al)
}

func refUUIDs(refs []node.DeviceRef) []string {
	out := make([]string, len(refs))
	for i, d := range refs {
		out[i] = d.UUID
	}
	return out
}
