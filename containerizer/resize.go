package containerizer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/node"
)

// Resize is the one grow/shrink step of a live container's whole GPUs,
// which every runtime's update and the chain isolator's run: the order of
// its calls keeps any GPU from being reachable from two containers, and
// makes the allocator the record a recovery trusts. A grow allocates first
// (allocator.Allocator.Allocate for an owner that holds nothing, Resize
// otherwise), records that (Commit), then enforces; a shrink has the
// allocator choose what stays (Shrink), enforces that (the GPUs that go
// are denied), then releases the rest (Retain, or Release for none) and
// records that. When a step after the allocator's change fails, the change
// is undone in the opposite order: the container is allowed what it had,
// then the owner holds it, then that is recorded.
//
// A process killed at any point leaves the allocator holding at least
// every GPU the container is allowed, and the container's record (Commit)
// either equal to the allocator or behind it: a recovery claims what the
// allocator holds, enforces that again and records it (Repairer).
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
	// a step fails, again with the old.
	Enforce func(ctx context.Context, gpus []node.DeviceRef) error
	// Commit, when set, records what the owner holds once the allocator
	// changed: on a grow after the allocation (before Enforce), on a
	// shrink after the release; again with the old holding when the
	// change is undone.
	Commit func(al allocator.Allocation) error
	// Logger, when set, gets a Debug record at each step that changes
	// something ("step": allocated, committed, enforced, released, undone):
	// the points at which a process killed leaves work for a recovery.
	Logger *slog.Logger
}

// To changes what the owner holds to n whole GPUs (0: none) and returns
// what it holds afterwards. On error it holds, and is allowed, what it
// held before, as far as undoing allows (the errors of the undo are
// joined), with two exceptions, where To returns what the owner holds now
// with the error and the record is the caller's to bring in line from the
// allocator (the record a recovery trusts): a grow whose new GPUs cannot
// be denied again keeps them held, so that no other container gets a GPU
// this one may still reach; a shrink whose Commit fails after the release
// is not undone (the released GPUs may be another's by then, and are
// denied already).
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
	r.step(ctx, "allocated", next)
	if err = r.commit(ctx, next); err == nil {
		if err = r.Enforce(ctx, next.Devices); err == nil {
			r.step(ctx, "enforced", next)
		}
	}
	if err == nil {
		return next, nil
	}
	// Back to what it held: the new GPUs denied (an Enforce that failed
	// half way may have allowed them), then given back, then recorded.
	bg := context.WithoutCancel(ctx)
	if deny := r.Enforce(bg, cur.Devices); deny != nil {
		return next, fmt.Errorf("resize %s to %d gpus: the new gpus stay held: %w", r.Owner, n, errors.Join(err, deny))
	}
	var undo error
	if len(cur.Devices) == 0 {
		undo = r.Allocator.Release(bg, r.Owner)
	} else {
		_, undo = r.Allocator.Retain(bg, r.Owner, refUUIDs(cur.Devices))
	}
	if undo != nil {
		return next, errors.Join(err, undo)
	}
	r.step(ctx, "undone", cur)
	return allocator.Allocation{}, errors.Join(err, r.commit(ctx, cur))
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
	r.step(ctx, "enforced", allocator.Allocation{Owner: r.Owner, Devices: keep})
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
	r.step(ctx, "released", next)
	if err := r.commit(ctx, next); err != nil {
		return next, fmt.Errorf("resize %s to %d gpus: done, not recorded: %w", r.Owner, n, err)
	}
	return next, nil
}

// reallow allows the container the GPUs it held before a shrink.
func (r Resize) reallow(ctx context.Context, cur allocator.Allocation) error {
	return r.Enforce(context.WithoutCancel(ctx), cur.Devices)
}

func (r Resize) commit(ctx context.Context, al allocator.Allocation) error {
	if r.Commit == nil {
		return nil
	}
	if err := r.Commit(al); err != nil {
		return err
	}
	r.step(ctx, "committed", al)
	return nil
}

// step logs a step done.
func (r Resize) step(ctx context.Context, step string, al allocator.Allocation) {
	if r.Logger != nil {
		r.Logger.DebugContext(ctx, "resize", "step", step, "owner", r.Owner, "gpus", len(al.Devices))
	}
}

func refUUIDs(refs []node.DeviceRef) []string {
	out := make([]string, len(refs))
	for i, d := range refs {
		out[i] = d.UUID
	}
	return out
}
