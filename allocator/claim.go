package allocator

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"

	"github.com/gpuiso/gpuiso/node"
)

// Claim makes owner hold exactly devices, the GPUs (or MIG devices) a
// container was started with, as its records or labels name them: it is
// how a recovery re-holds the GPUs of a container that outlived the
// allocator's memory of it. It is idempotent and compares sets, never
// orders:
//
//   - owner already holds exactly these devices (in any order; for a shared
//     allocation, its one GPU): nothing changes, and Claim returns the
//     allocation;
//   - owner holds nothing and every device is free and healthy: owner takes
//     them, exclusively (a memory share is not re-made: its size is not in
//     the devices), in one change on disk before Claim returns;
//   - owner holds other devices: a *ClaimError matching ErrClaimMismatch;
//   - a device is held by another owner, unhealthy, or a GPU whose MIG
//     devices are handed out instead: ErrDeviceUnavailable; a device the
//     node does not have: ErrUnknownDevice; one named twice:
//     ErrDuplicateDevice.
//
// On error nothing changes. Claiming no devices for an owner that holds
// nothing succeeds with an empty allocation and holds nothing. The holder
// of an allocation that already existed is kept, unless HeldBy names
// another: then the one change on disk (or the only one, for an allocation
// that existed) makes it the holder too.
//
// With AsShare, devices is the one GPU a share was started with, and Claim
// makes owner hold that share of it (see AsShare): one call re-holds whole
// GPUs, MIG devices and shares alike.
func (a *Allocator) Claim(ctx context.Context, owner string, devices []node.DeviceRef, opts ...ClaimOption) (Allocation, error) {
	if a.inv == nil {
		return Allocation{}, ErrNotMade
	}
	o, err := claimOptionsOf(opts)
	if err != nil {
		return Allocation{}, fmt.Errorf("claim %d gpus for %s: %w", len(devices), owner, err)
	}
	if o.share != nil {
		if len(devices) != 1 {
			return Allocation{}, fmt.Errorf("claim a share of %s for %s: %d devices, want the one GPU shared: %w", o.share, owner, len(devices), ErrInvalidRequest)
		}
		al, err := a.claimShare(ctx, owner, devices[0], *o.share, o)
		if err != nil {
			return Allocation{}, fmt.Errorf("claim a share of %s for %s: %w", o.share, owner, err)
		}
		return al, nil
	}
	al, err := a.claim(ctx, owner, devices, o)
	if err != nil {
		return Allocation{}, fmt.Errorf("claim %d gpus for %s: %w", len(devices), owner, err)
	}
	return al, nil
}

func (a *Allocator) claim(ctx context.Context, owner string, devices []node.DeviceRef, o claimOptions) (Allocation, error) {
	if err := ctx.Err(); err != nil {
		return Allocation{}, err
	}
	if err := node.ValidateOwner(owner); err != nil {
		return Allocation{}, err
	}
	unlock, err := a.lock(ctx)
	if err != nil {
		return Allocation{}, err
	}
	defer unlock()
	want, err := a.claimed(devices) // MIG devices as the state has them now
	if err != nil {
		return Allocation{}, err
	}
	if h, ok := a.owners[owner]; ok {
		if !a.holds(h, want) {
			return Allocation{}, &ClaimError{Owner: owner, Held: refNames(a.allocation(owner, h).Devices), Claimed: refNames(devices)}
		}
		return a.rehold(ctx, owner, h, o.holder)
	}
	if len(want.mig) == 0 && want.devices == 0 {
		return Allocation{Owner: owner}, nil
	}
	if o.created && len(want.mig) > 0 && a.cfg.migManager == nil {
		return Allocation{}, fmt.Errorf("MIG devices claimed as created on demand without a MIG manager: %w", node.ErrNotSupported)
	}
	h := &holding{shared: -1, devices: want.devices, mig: want.mig, holder: o.holder}
	usable := a.usable() | a.emptyMIGParents()
	for _, p := range a.positions(want.devices) {
		if usable&(1<<p) == 0 {
			return Allocation{}, fmt.Errorf("%s: %s: %w", a.name(p), a.why(p, compiled{match: ^uint64(0)}), ErrDeviceUnavailable)
		}
	}
	for _, k := range want.mig {
		if !a.migUsable(k) {
			why := "unhealthy"
			if o := a.mig.owner[k]; o != "" {
				why = "owned by " + o
			}
			return Allocation{}, fmt.Errorf("MIG device %s: %s: %w", a.mig.units[k].dev.UUID, why, ErrDeviceUnavailable)
		}
	}
	if err := a.checkQuota(owner, h); err != nil {
		return Allocation{}, err
	}
	a.apply(owner, h)
	was := make([]bool, len(h.mig))
	for i, k := range h.mig {
		was[i] = a.mig.units[k].dynamic
		a.mig.units[k].dynamic = a.mig.units[k].dynamic || o.created
	}
	undo := func() {
		a.apply(owner, nil)
		for i, k := range h.mig {
			a.mig.units[k].dynamic = was[i]
		}
	}
	if err := a.persist(ctx, undo); err != nil {
		return Allocation{}, err
	}
	if a.cfg.logger.Enabled(ctx, slog.LevelDebug) {
		a.cfg.logger.Debug("claimed", "owner", owner, "devices", a.positions(h.devices), "mig", a.migUUIDs(h.mig))
	}
	return a.allocation(owner, h), nil
}

// ClaimOption changes what Claim does.
type ClaimOption func(*claimOptions) error

type claimOptions struct {
	holder  *Holder
	created bool
	share   *Share
}

// AsShare makes Claim re-hold share s (a memory share, a time slice or a
// concurrent slice, whose memory may be left 0) of the one GPU it is
// given, the GPU a container was started with and the share its record
// names: how a recovery re-holds a share the allocator's memory lost. Like any claim, it is idempotent:
//
//   - owner already holds exactly s on the GPU: nothing changes;
//   - owner holds nothing, and the GPU can take s (shareable, or holding
//     shares already, not held whole, by shares of another mode or by
//     slices of another count, with room): owner takes it, in one change
//     on disk;
//   - owner holds something else: a *ClaimError matching ErrClaimMismatch;
//   - the GPU cannot take s: ErrDeviceUnavailable; a device the node lacks:
//     ErrUnknownDevice; a MIG device: ErrShareNotSupported; s itself is
//     malformed, or the claim names other than one device:
//     ErrInvalidRequest.
//
// A GPU not configured shareable in this allocator takes the share all the
// same (as New does for the shares it loads): the container uses it so.
// Created does not apply to a share.
func AsShare(s Share) ClaimOption {
	return func(o *claimOptions) error {
		o.share = &s
		return nil
	}
}

// Created makes the MIG devices that Claim makes owner hold count as
// created on demand (WithMIGManager): Release destroys them, as it does
// those AllocateMIGAt made. It is how a recovery takes over a MIG device
// its own record says it was creating when the process ended, after the
// MIG manager made the device and before the allocator recorded it, so
// that the device does not stay behind for good. Without a MIG manager a
// claim of MIG devices with it fails with node.ErrNotSupported.
func Created() ClaimOption {
	return func(o *claimOptions) error {
		o.created = true
		return nil
	}
}

// HeldBy makes h the holder of the claimed allocation (as Request.Holder
// makes it that of an allocation): of one the claim makes, and of one the
// owner held already, in the claim's one change on disk (none when h
// holds it already). A recovery that takes a container over, or claims
// the GPUs of another live process's container, so persists once.
func HeldBy(h Holder) ClaimOption {
	return func(o *claimOptions) error {
		if err := validHolder(h); err != nil {
			return err
		}
		o.holder = &h
		return nil
	}
}

func claimOptionsOf(opts []ClaimOption) (claimOptions, error) {
	var o claimOptions
	for _, opt := range opts {
		if opt == nil {
			return o, fmt.Errorf("nil claim option: %w", ErrInvalidRequest)
		}
		if err := opt(&o); err != nil {
			return o, err
		}
	}
	return o, nil
}

// rehold returns owner's allocation h, which a claim found as claimed,
// first made held by holder where holder names another (one change on
// disk). The caller holds a.mu.
func (a *Allocator) rehold(ctx context.Context, owner string, h *holding, holder *Holder) (Allocation, error) {
	if holder == nil || (h.holder != nil && *h.holder == *holder) {
		return a.allocation(owner, h), nil
	}
	next := *h
	next.holder = holder
	next.mig = slices.Clone(h.mig)
	a.apply(owner, &next)
	if err := a.persist(ctx, func() { a.apply(owner, h) }); err != nil {
		return Allocation{}, err
	}
	return a.allocation(owner, &next), nil
}

// claimSet is a claim's devices: whole GPUs by position, or MIG devices by
// unit, ascending.
type claimSet struct {
	devices uint64
	mig     []int
}

// claimed resolves devices: by UUID (a "MIG-" UUID names a MIG device),
// else by index. The caller holds a.mu.
func (a *Allocator) claimed(devices []node.DeviceRef) (claimSet, error) {
	var s claimSet
	for _, d := range devices {
		id := strings.TrimSpace(d.UUID)
		if node.IsMIGUUID(id) {
			k, ok := a.migUnitOf(id)
			if !ok {
				return s, fmt.Errorf("MIG device %q: %w", id, ErrUnknownDevice)
			}
			if slices.Contains(s.mig, k) {
				return s, fmt.Errorf("%s: %w", id, ErrDuplicateDevice)
			}
			s.mig = append(s.mig, k)
			continue
		}
		if id == "" {
			id = strconv.Itoa(d.Index)
		}
		p, err := a.resolve(id)
		if err != nil {
			return s, err
		}
		if s.devices&(1<<p) != 0 {
			return s, fmt.Errorf("%s: %w", id, ErrDuplicateDevice)
		}
		s.devices |= 1 << p
	}
	if s.devices != 0 && len(s.mig) > 0 {
		return s, fmt.Errorf("whole GPUs and MIG devices in one claim: %w", ErrInvalidRequest)
	}
	slices.Sort(s.mig)
	return s, nil
}

// holds tells whether h is exactly the set s.
func (a *Allocator) holds(h *holding, s claimSet) bool {
	if h.shared >= 0 {
		return len(s.mig) == 0 && s.devices == 1<<h.shared
	}
	if k, ok := h.migShare(); ok {
		return s.devices == 0 && slices.Equal(s.mig, []int{k})
	}
	return h.devices == s.devices && slices.Equal(h.mig, s.mig)
}

// refNames are the UUIDs of refs (or their indexes, for refs without one),
// sorted.
func refNames(refs []node.DeviceRef) []string {
	out := make([]string, len(refs))
	for i, r := range refs {
		out[i] = r.UUID
		if out[i] == "" {
			out[i] = strconv.Itoa(r.Index)
		}
	}
	slices.Sort(out)
	return out
}

// SetHolder makes h what proves owner's allocation alive (nil: nothing,
// so ReleaseDead keeps it), in one change on disk, keeping its devices: the
// hand-over of a claim from the process that made it to the container's
// init, with no moment at which the devices are free.
func (a *Allocator) SetHolder(ctx context.Context, owner string, h *Holder) error {
	if a.inv == nil {
		return ErrNotMade
	}
	if err := a.setHolder(ctx, owner, h); err != nil {
		return fmt.Errorf("set holder of %s: %w", owner, err)
	}
	return nil
}

func (a *Allocator) setHolder(ctx context.Context, owner string, h *Holder) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	var holder *Holder
	if h != nil {
		if err := validHolder(*h); err != nil {
			return err
		}
		hh := *h
		holder = &hh
	}
	unlock, err := a.lock(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	old, ok := a.owners[owner]
	if !ok {
		return ErrUnknownOwner
	}
	next := *old
	next.holder = holder
	next.mig = slices.Clone(old.mig)
	a.apply(owner, &next)
	return a.persist(ctx, func() { a.apply(owner, old) })
}
