package allocator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"

	"github.com/gpuiso/gpuiso/node"
)

// MIGManager creates and destroys MIG devices on the node's GPUs with MIG
// enabled (dynamic MIG). simnode.Node.MIGManager is one, for simulated
// nodes; the allocator uses none unless given one.
type MIGManager interface {
	// CreateMIG creates a MIG device of profile on the GPU with UUID
	// parent and returns it as discovery would read it. An error matching
	// node.ErrInsufficient means the GPU has no room for it.
	CreateMIG(ctx context.Context, parent, profile string) (node.MIGDevice, error)
	// DestroyMIG destroys the MIG device with UUID device of GPU parent.
	DestroyMIG(ctx context.Context, parent, device string) error
}

// WithMIGManager turns on dynamic MIG: a request for a MIG profile that the
// existing MIG devices cannot serve gets new ones created through m, on the
// GPUs with MIG enabled (packed onto those in use first), and the devices
// created so are destroyed when released. A request whose creations fail in
// part gets none: what it created is destroyed again, leaving the layout as
// it was. Off by default.
func WithMIGManager(m MIGManager) Option {
	return func(s *settings) error {
		if m == nil {
			return errors.New("nil MIG manager")
		}
		s.migManager = m
		return nil
	}
}

// createMIG creates need MIG devices of m.profile for a request, adding
// them to the table as free units, and returns their unit numbers. On error
// it returns the units it created, for the caller to drop. The caller holds
// a.mu.
func (a *Allocator) createMIG(ctx context.Context, m migMatch, need int) ([]int, error) {
	held := map[int]int{}
	for k, u := range a.mig.units {
		if !u.gone && (a.mig.owner[k] != "" || len(a.mig.shares[k]) > 0) {
			held[u.pos]++
		}
	}
	var parents []int
	for p := range a.n {
		if a.mig.parents&(1<<p) != 0 && m.parents&(1<<p) != 0 && a.health[p].Healthy && a.exclusive[p] == "" {
			if _, ok := a.inv.Devices[p].MIGProfile(m.profile); ok {
				parents = append(parents, p)
			}
		}
	}
	sort.SliceStable(parents, func(i, j int) bool { return held[parents[i]] > held[parents[j]] })
	var created []int
	for _, p := range parents {
		for need > 0 {
			dev, err := a.cfg.migManager.CreateMIG(ctx, a.inv.Devices[p].UUID, m.profile)
			if errors.Is(err, node.ErrInsufficient) {
				break
			}
			if err != nil {
				return created, fmt.Errorf("create MIG device %s on %s: %w", m.profile, a.name(p), err)
			}
			dev.Parent, dev.ParentUUID = a.inv.Devices[p].Index, a.inv.Devices[p].UUID
			created = append(created, a.addUnit(p, dev))
			need--
		}
	}
	if need > 0 {
		return created, &InsufficientError{Requested: m.count, Free: m.count - need}
	}
	return created, nil
}

// addUnit puts a created MIG device in the table (in a slot a destroyed one
// left, else at the end) and in the allocator's inventory.
func (a *Allocator) addUnit(p int, dev node.MIGDevice) int {
	if dev.Health == (node.Health{}) {
		dev.Health = node.Healthy()
	}
	u := migUnit{pos: p, dev: dev, dynamic: true}
	d := &a.inv.Devices[p]
	d.MIGDevices = append(slices.Clone(d.MIGDevices), dev)
	sort.SliceStable(d.MIGDevices, func(i, j int) bool { return d.MIGDevices[i].GI < d.MIGDevices[j].GI })
	for k, old := range a.mig.units {
		if old.gone {
			a.mig.units[k], a.mig.owner[k], a.mig.health[k] = u, "", dev.Health
			return k
		}
	}
	a.mig.units = append(a.mig.units, u)
	a.mig.owner = append(a.mig.owner, "")
	a.mig.health = append(a.mig.health, dev.Health)
	return len(a.mig.units) - 1
}

// destroyUnits destroys dynamic MIG devices that nobody holds and takes
// them out of the table and inventory. One that cannot be destroyed stays,
// free, and its error is returned with the others'. The caller holds a.mu.
func (a *Allocator) destroyUnits(ctx context.Context, units []int) error {
	ctx = context.WithoutCancel(ctx) // an undo must finish
	var errs []error
	for _, k := range units {
		u := a.mig.units[k]
		if !u.dynamic || u.gone || a.mig.owner[k] != "" || len(a.mig.shares[k]) > 0 {
			continue
		}
		if err := a.cfg.migManager.DestroyMIG(ctx, a.inv.Devices[u.pos].UUID, u.dev.UUID); err != nil {
			a.cfg.logger.Warn("MIG device not destroyed", "device", u.dev.UUID, "err", err)
			errs = append(errs, fmt.Errorf("destroy MIG device %s: %w", u.dev.UUID, err))
			continue
		}
		d := &a.inv.Devices[u.pos]
		d.MIGDevices = slices.DeleteFunc(slices.Clone(d.MIGDevices), func(m node.MIGDevice) bool { return m.UUID == u.dev.UUID })
		a.mig.units[k] = migUnit{pos: u.pos, gone: true}
		a.mig.health[k] = node.Healthy()
	}
	return errors.Join(errs...)
}

// releaseDynamic destroys the dynamic MIG devices of a holding just
// released (the caller holds a.mu). A failure leaves the device free.
func (a *Allocator) releaseDynamic(ctx context.Context, h *holding) {
	if a.cfg.migManager == nil || h == nil || len(h.mig) == 0 {
		return
	}
	_ = a.destroyUnits(ctx, h.mig) // logged; the device stays, free
}
