package allocator

import (
	"context"
	"fmt"
	"log/slog"
	"math/bits"
	"strconv"

	"github.com/gpuiso/gpuiso/node"
)

// Allocate gives owner the GPUs of r, or nothing: on error the allocator
// is unchanged.
func (a *Allocator) Allocate(ctx context.Context, owner string, r Request) (Allocation, error) {
	if a.inv == nil {
		return Allocation{}, ErrNotMade
	}
	alloc, err := a.allocate(ctx, owner, r)
	if err != nil {
		return Allocation{}, fmt.Errorf("allocate %s for %s: %w", describe(r), owner, err)
	}
	return alloc, nil
}

func (a *Allocator) allocate(ctx context.Context, owner string, r Request) (Allocation, error) {
	if err := ctx.Err(); err != nil {
		return Allocation{}, err
	}
	if err := node.ValidateOwner(owner); err != nil {
		return Allocation{}, err
	}
	if isMIGShareRequest(r) {
		s, err := r.share()
		if err != nil {
			return Allocation{}, err
		}
		return a.allocateMIGShare(ctx, owner, r, *s)
	}
	if isMIGRequest(r) {
		return a.allocateMIG(ctx, owner, r)
	}
	c, err := a.compile(r)
	if err != nil {
		return Allocation{}, err
	}
	unlock, err := a.lock(ctx)
	if err != nil {
		return Allocation{}, err
	}
	defer unlock()
	if _, ok := a.owners[owner]; ok {
		return Allocation{}, ErrOwnerExists
	}
	h := &holding{group: c.group, shared: -1, holder: c.holder}
	if c.share != nil {
		p, err := a.placeShare(c, *c.share)
		if err != nil {
			return Allocation{}, err
		}
		h.shared, h.memory, h.mode, h.compute, h.slices = p, c.share.MemoryBytes, c.share.Mode, c.share.ComputePercent, c.share.Slices
		if h.mode == ShareSlice {
			h.memory = a.sliceMemory(p, h.slices)
		}
	} else {
		set, err := a.placeExclusive(c, 0)
		if err != nil {
			return Allocation{}, err
		}
		h.devices = set
	}
	if err := a.checkQuota(owner, h); err != nil {
		return Allocation{}, err
	}
	a.apply(owner, h)
	if err := a.persist(ctx, func() { a.apply(owner, nil) }); err != nil {
		return Allocation{}, err
	}
	if a.cfg.logger.Enabled(ctx, slog.LevelDebug) {
		a.cfg.logger.Debug("allocated", "owner", owner, "devices", a.positions(h.devices), "shared", h.shared, "mode", h.mode, "memory", h.memory)
	}
	return a.allocation(owner, h), nil
}

// usable is the mask of devices that may be handed out exclusively.
func (a *Allocator) usable() uint64 {
	var m uint64
	for p := range a.n {
		if a.health[p].Healthy && a.exclusive[p] == "" && len(a.shares[p]) == 0 && a.mig.parents&(1<<p) == 0 {
			m |= 1 << p
		}
	}
	return m
}

// acceptable is the mask of the devices of sick that may be handed out
// exclusively but for their health (Request.AcceptUnhealthy).
func (a *Allocator) acceptable(sick uint64) uint64 {
	var m uint64
	for _, p := range a.positions(sick) {
		if a.exclusive[p] == "" && len(a.shares[p]) == 0 && a.mig.parents&(1<<p) == 0 {
			m |= 1 << p
		}
	}
	return m
}

// shareable is the mask of GPUs configured for shares.
func (a *Allocator) shareable() uint64 {
	var m uint64
	for p := range a.n {
		if a.shares[p] != nil {
			m |= 1 << p
		}
	}
	return m
}

// placeExclusive chooses c.count GPUs; held are GPUs the owner keeps (a
// resize), which count toward c.count.
func (a *Allocator) placeExclusive(c compiled, held uint64) (uint64, error) {
	free := (a.usable() | a.acceptable(c.sick) | a.emptyMIGParents()&c.must) & c.match
	for _, p := range a.positions(c.must &^ held) {
		if free&(1<<p) == 0 {
			return 0, fmt.Errorf("%s: %s: %w", a.name(p), a.why(p, c), ErrDeviceUnavailable)
		}
	}
	must := c.must | held
	avail := bits.OnesCount64(free&^must) + bits.OnesCount64(must)
	if avail < c.count {
		return 0, &InsufficientError{Requested: c.count, Free: bits.OnesCount64(free &^ held)}
	}
	// Keep shareable GPUs for shares while other GPUs can serve.
	cands := free | must
	if whole := cands&^a.shareable() | must; bits.OnesCount64(whole) >= c.count {
		cands = whole
	}
	set := a.choose(a.cfg.policy, cands, must, c.count, c.affinity, c.hasAff)
	return set, nil
}

// why says why device p cannot serve c.
func (a *Allocator) why(p int, c compiled) string {
	switch {
	case a.exclusive[p] != "":
		return "owned by " + a.exclusive[p]
	case len(a.shares[p]) > 0:
		return "shared"
	case a.mig.parents&(1<<p) != 0:
		return "MIG enabled (handed out by MIG device)"
	case !a.health[p].Healthy:
		return a.health[p].String()
	case c.match&(1<<p) == 0:
		return "does not match the request's model or constraints"
	}
	return "not free"
}

func (a *Allocator) freeMemory(p int) uint64 {
	var used uint64
	for _, m := range a.shares[p] {
		used += m
	}
	total := a.inv.Devices[p].MemoryBytes
	if used >= total {
		return 0
	}
	return total - used
}

// groupDevices is the mask of GPUs the owners of group hold, leaving out
// except.
func (a *Allocator) groupDevices(group, except string) uint64 {
	var m uint64
	for o, h := range a.owners {
		if o == except || h.group != group {
			continue
		}
		m |= h.devices | a.migParentsOf(h.mig) | a.migShareParent(h)
		if h.shared >= 0 {
			m |= 1 << h.shared
		}
	}
	return m
}

func (a *Allocator) checkQuota(owner string, h *holding) error {
	limit, ok := a.cfg.quotas[h.group]
	if !ok {
		return nil
	}
	used := a.groupDevices(h.group, owner)
	want := h.devices | a.migParentsOf(h.mig) | a.migShareParent(h)
	if h.shared >= 0 {
		want |= 1 << h.shared
	}
	if bits.OnesCount64(used|want) > limit {
		return &QuotaError{Group: h.group, Limit: limit, Used: bits.OnesCount64(used), Requested: bits.OnesCount64(want &^ used)}
	}
	return nil
}

// apply makes owner hold h (nil: nothing), in memory.
func (a *Allocator) apply(owner string, h *holding) {
	a.applyMIG(owner, a.owners[owner], h)
	a.applyMIGShare(owner, a.owners[owner], h)
	if old := a.owners[owner]; old != nil {
		for _, p := range a.positions(old.devices) {
			a.exclusive[p] = ""
		}
		if old.shared >= 0 {
			delete(a.shares[old.shared], owner)
		}
		delete(a.owners, owner)
	}
	if h == nil {
		return
	}
	for _, p := range a.positions(h.devices) {
		a.exclusive[p] = owner
	}
	if h.shared >= 0 {
		a.shares[h.shared][owner] = h.memory
	}
	a.owners[owner] = h
}

// persist writes the state when the allocator is durable. When it cannot,
// undo takes the change back in memory and the previous state is written
// again (a failure late in a write may have left the new one on disk), so
// that memory and disk agree on "nothing changed".
func (a *Allocator) persist(ctx context.Context, undo func()) error {
	if a.store == nil {
		return nil
	}
	if err := ctx.Err(); err != nil {
		undo()
		return err
	}
	err := a.store.save(a.snapshot())
	if err != nil {
		undo()
		if again := a.store.save(a.snapshot()); again != nil {
			a.cfg.logger.Error("state may be ahead of memory", "file", a.store.path(), "err", again)
		}
	}
	return err
}

func (a *Allocator) positions(m uint64) []int {
	out := make([]int, 0, bits.OnesCount64(m))
	for m != 0 {
		p := bits.TrailingZeros64(m)
		out = append(out, p)
		m &^= 1 << p
	}
	return out
}

func (a *Allocator) name(p int) string {
	d := a.inv.Devices[p]
	return "gpu " + strconv.Itoa(d.Index)
}

// Release frees everything owner holds.
func (a *Allocator) Release(ctx context.Context, owner string) error {
	if a.inv == nil {
		return ErrNotMade
	}
	if err := a.release(ctx, owner); err != nil {
		return fmt.Errorf("release %s: %w", owner, err)
	}
	return nil
}

func (a *Allocator) release(ctx context.Context, owner string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	unlock, err := a.lock(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	h, ok := a.owners[owner]
	if !ok {
		return ErrUnknownOwner
	}
	a.apply(owner, nil)
	if err := a.persist(ctx, func() { a.apply(owner, h) }); err != nil {
		return err
	}
	a.releaseDynamic(ctx, h)
	if a.cfg.logger.Enabled(ctx, slog.LevelDebug) {
		a.cfg.logger.Debug("released", "owner", owner)
	}
	return nil
}

// Resize grows or shrinks owner's exclusive allocation to count GPUs, for
// a live update: the GPUs it keeps stay, new ones are placed by the policy
// next to them, and a shrink keeps the best-connected healthy subset.
func (a *Allocator) Resize(ctx context.Context, owner string, count int) (Allocation, error) {
	if a.inv == nil {
		return Allocation{}, ErrNotMade
	}
	al, err := a.resize(ctx, owner, count)
	if err != nil {
		return Allocation{}, fmt.Errorf("resize %s to %d gpus: %w", owner, count, err)
	}
	return al, nil
}

func (a *Allocator) resize(ctx context.Context, owner string, count int) (Allocation, error) {
	if err := ctx.Err(); err != nil {
		return Allocation{}, err
	}
	if count <= 0 || count > a.n {
		return Allocation{}, fmt.Errorf("count %d on a node of %d: %w", count, a.n, ErrInvalidRequest)
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
	if h.shared >= 0 {
		return Allocation{}, fmt.Errorf("shared allocation: %w", ErrInvalidRequest)
	}
	if len(h.mig) > 0 {
		return Allocation{}, fmt.Errorf("MIG allocation: %w", ErrInvalidRequest)
	}
	have := bits.OnesCount64(h.devices)
	next := &holding{group: h.group, shared: -1, holder: h.holder}
	switch {
	case count == have:
		return a.allocation(owner, h), nil
	case count < have:
		next.devices = a.shrinkSet(h.devices, count)
	default:
		c := compiled{count: count, match: ^uint64(0)}
		set, err := a.placeExclusive(c, h.devices)
		if err != nil {
			return Allocation{}, err
		}
		next.devices = set
	}
	if err := a.checkQuota(owner, next); err != nil {
		return Allocation{}, err
	}
	a.apply(owner, next)
	if err := a.persist(ctx, func() { a.apply(owner, h) }); err != nil {
		return Allocation{}, err
	}
	return a.allocation(owner, next), nil
}

// shrinkSet is the count GPUs of held that a shrink keeps: healthy ones
// first, then as the placement policy would choose among them.
func (a *Allocator) shrinkSet(held uint64, count int) uint64 {
	cands := held
	healthy := uint64(0)
	for _, p := range a.positions(held) {
		if a.health[p].Healthy {
			healthy |= 1 << p
		}
	}
	if bits.OnesCount64(healthy) >= count {
		cands = healthy
	}
	return a.choose(a.cfg.policy, cands, 0, count, nil, false)
}
