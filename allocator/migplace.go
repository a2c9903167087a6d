package allocator

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/gpuiso/gpuiso/node"
)

// MIGPlacer is a MIGManager that also creates a MIG device at a placement
// its caller chose (a scheduler that tracks each GPU's memory slices
// decides where an instance goes, not the driver). simnode's MIGManager is
// one.
type MIGPlacer interface {
	MIGManager
	// CreateMIGAt creates a MIG device of profile on GPU parent at the
	// placement that starts at memory slice start. An error matching
	// node.ErrInsufficient means an instance is in the way.
	CreateMIGAt(ctx context.Context, parent, profile string, start int) (node.MIGDevice, error)
}

// MIGAt names a MIG device to create: a profile at a placement of a GPU
// with MIG enabled.
type MIGAt struct {
	// Parent is the GPU's "GPU-" UUID.
	Parent string `json:"parent"`
	// Profile is the GPU-instance profile ("1g.10gb").
	Profile string `json:"profile"`
	// Start is the placement's first memory slice.
	Start int `json:"start"`
	// Group is the tenant the device counts against (see WithQuota).
	Group string `json:"group,omitempty"`
}

// AllocateMIGAt creates a MIG device of at.Profile at memory slice
// at.Start of GPU at.Parent, through the MIG manager (WithMIGManager, which
// must be a MIGPlacer), and makes owner hold it; Release destroys it, as it
// does every device created on demand. The GPU must have MIG enabled, be
// healthy and not held whole (a request naming a GPU with MIG enabled
// and no MIG device holds it whole, with a MIG manager). On error nothing
// changes: a device created for the call is destroyed again. It fails with
// ErrNotSupported without a placer, ErrOwnerExists, ErrUnknownDevice or
// ErrUnknownMIGProfile for a GPU or profile the node does not have,
// ErrDeviceUnavailable for a GPU that cannot take one now, and an error
// matching node.ErrInsufficient when an instance is in the way.
func (a *Allocator) AllocateMIGAt(ctx context.Context, owner string, at MIGAt) (Allocation, error) {
	if a.inv == nil {
		return Allocation{}, ErrNotMade
	}
	al, err := a.allocateMIGAt(ctx, owner, at)
	if err != nil {
		return Allocation{}, fmt.Errorf("allocate MIG device %s at %d of %s for %s: %w", at.Profile, at.Start, at.Parent, owner, err)
	}
	return al, nil
}

func (a *Allocator) allocateMIGAt(ctx context.Context, owner string, at MIGAt) (Allocation, error) {
	if err := ctx.Err(); err != nil {
		return Allocation{}, err
	}
	if err := node.ValidateOwner(owner); err != nil {
		return Allocation{}, err
	}
	placer, ok := a.cfg.migManager.(MIGPlacer)
	if !ok {
		return Allocation{}, fmt.Errorf("no MIG manager that places devices: %w", node.ErrNotSupported)
	}
	if len(at.Group) > node.MaxOwnerLen {
		return Allocation{}, fmt.Errorf("group name longer than %d bytes: %w", node.MaxOwnerLen, ErrInvalidRequest)
	}
	unlock, err := a.lock(ctx)
	if err != nil {
		return Allocation{}, err
	}
	defer unlock()
	if _, ok := a.owners[owner]; ok {
		return Allocation{}, ErrOwnerExists
	}
	p := -1
	for q := range a.n {
		if strings.EqualFold(a.inv.Devices[q].UUID, strings.TrimSpace(at.Parent)) {
			p = q
		}
	}
	switch {
	case p < 0:
		return Allocation{}, fmt.Errorf("GPU %q: %w", at.Parent, ErrUnknownDevice)
	case a.mig.parents&(1<<p) == 0:
		return Allocation{}, fmt.Errorf("%s: MIG disabled: %w", a.name(p), ErrDeviceUnavailable)
	case !a.health[p].Healthy:
		return Allocation{}, fmt.Errorf("%s: %s: %w", a.name(p), a.health[p].String(), ErrDeviceUnavailable)
	case a.exclusive[p] != "":
		return Allocation{}, fmt.Errorf("%s: held whole by %s: %w", a.name(p), a.exclusive[p], ErrDeviceUnavailable)
	}
	if _, ok := a.inv.Devices[p].MIGProfile(at.Profile); !ok {
		return Allocation{}, fmt.Errorf("%q on %s: %w", at.Profile, a.name(p), ErrUnknownMIGProfile)
	}
	dev, err := placer.CreateMIGAt(ctx, a.inv.Devices[p].UUID, at.Profile, at.Start)
	if err != nil {
		return Allocation{}, fmt.Errorf("create MIG device on %s: %w", a.name(p), err)
	}
	dev.Parent, dev.ParentUUID = a.inv.Devices[p].Index, a.inv.Devices[p].UUID
	k := a.addUnit(p, dev)
	h := &holding{group: at.Group, shared: -1, mig: []int{k}}
	undo := func(err error) (Allocation, error) {
		if derr := a.destroyUnits(ctx, []int{k}); derr != nil {
			return Allocation{}, fmt.Errorf("%w (and %w)", err, derr)
		}
		return Allocation{}, err
	}
	if err := a.checkQuota(owner, h); err != nil {
		return undo(err)
	}
	a.apply(owner, h)
	if err := a.persist(ctx, func() { a.apply(owner, nil) }); err != nil {
		return undo(err)
	}
	if a.cfg.logger.Enabled(ctx, slog.LevelDebug) {
		a.cfg.logger.Debug("created and allocated a MIG device", "owner", owner, "mig", dev.UUID, "placement", dev.Placement.String())
	}
	return a.allocation(owner, h), nil
}

// emptyMIGParents is the mask of the GPUs with MIG enabled that may be
// held whole: with a MIG manager (dynamic MIG), a GPU with MIG enabled and
// no MIG device at all, healthy and held by nobody. While one is held
// whole no MIG device is created on it; while it has a MIG device it is
// not handed out whole. Only a request that names such a GPU gets it. The
// caller holds a.mu.
func (a *Allocator) emptyMIGParents() uint64 {
	if a.cfg.migManager == nil || a.mig.parents == 0 {
		return 0
	}
	m := a.mig.parents
	for _, u := range a.mig.units {
		if !u.gone {
			m &^= 1 << u.pos
		}
	}
	for p := range a.n {
		if !a.health[p].Healthy || a.exclusive[p] != "" || len(a.shares[p]) > 0 {
			m &^= 1 << p
		}
	}
	return m
}

// liveUnits are the MIG devices that exist (not destroyed).
func (a *Allocator) liveUnits() []int {
	var out []int
	for k, u := range a.mig.units {
		if !u.gone {
			out = append(out, k)
		}
	}
	return out
}

// PlacesMIG reports whether a can make MIG devices at placements
// (AllocateMIGAt): whether its MIG manager (WithMIGManager) is a
// MIGPlacer.
func (a *Allocator) PlacesMIG() bool {
	_, ok := a.cfg.migManager.(MIGPlacer)
	return ok
}
