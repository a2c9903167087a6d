package allocator

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/gpuiso/gpuiso/node"
)

// Owners returns who holds device (index, UUID or bus id): one exclusive
// owner, the owners of its shares or of its MIG devices, or none. A MIG
// device ("MIG-" UUID) has one owner or none.
func (a *Allocator) Owners(device string) ([]string, error) {
	if a.inv == nil {
		return nil, ErrNotMade
	}
	if node.IsMIGUUID(strings.TrimSpace(device)) {
		a.mu.Lock()
		defer a.mu.Unlock()
		a.refresh()
		k, ok := a.migUnitOf(device)
		if !ok {
			return nil, fmt.Errorf("owners: MIG device %q: %w", device, ErrUnknownDevice)
		}
		if o := a.mig.owner[k]; o != "" {
			return []string{o}, nil
		}
		owners := a.migShareOwners(k)
		slices.Sort(owners)
		return owners, nil
	}
	p, err := a.resolve(device)
	if err != nil {
		return nil, fmt.Errorf("owners: %w", err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.refresh()
	return a.ownersOf(p), nil
}

func (a *Allocator) ownersOf(p int) []string {
	if a.exclusive[p] != "" {
		return []string{a.exclusive[p]}
	}
	out := make([]string, 0, len(a.shares[p]))
	for o := range a.shares[p] {
		out = append(out, o)
	}
	out = append(out, a.migOwnersOf(p)...)
	sort.Strings(out)
	return out
}

// Allocation returns a copy of what owner holds.
func (a *Allocator) Allocation(owner string) (Allocation, error) {
	if a.inv == nil {
		return Allocation{}, ErrNotMade
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.refresh()
	h, ok := a.owners[owner]
	if !ok {
		return Allocation{}, fmt.Errorf("allocation of %s: %w", owner, ErrUnknownOwner)
	}
	return a.allocation(owner, h), nil
}

// Allocations returns copies of every allocation, ordered by owner.
func (a *Allocator) Allocations() []Allocation {
	if a.inv == nil {
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.refresh()
	names := make([]string, 0, len(a.owners))
	for o := range a.owners {
		names = append(names, o)
	}
	sort.Strings(names)
	out := make([]Allocation, 0, len(names))
	for _, o := range names {
		out = append(out, a.allocation(o, a.owners[o]))
	}
	return out
}

// Devices returns copies of the node's devices with their current health.
func (a *Allocator) Devices() []node.Device {
	if a.inv == nil {
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.refresh()
	out := make([]node.Device, a.n)
	for p := range a.n {
		out[p] = a.inv.Devices[p].Clone()
		out[p].Health = a.health[p]
		a.withMIGHealth(p, &out[p])
	}
	return out
}

// Free returns the positions of the GPUs that may be handed out whole now.
func (a *Allocator) Free() []int {
	if a.inv == nil {
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.refresh()
	return a.positions(a.usable())
}

// Policy is the allocator's placement policy.
func (a *Allocator) Policy() Policy { return a.cfg.policy }

// Inventory returns a copy of the inventory the allocator was made with:
// the node a containerizer built on this allocator runs containers on.
// Health is as the inventory had it; Devices has the current one.
func (a *Allocator) Inventory() *node.Inventory {
	if a.inv == nil {
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.inv.Clone()
}

// Topology is the node's topology.
func (a *Allocator) Topology() *node.Topology {
	if a.inv == nil {
		return nil
	}
	return a.inv.Topology
}

// Warnings are what New found in the saved state and could not keep, one
// a line (for instance a GPU that is no longer in the inventory).
func (a *Allocator) Warnings() []string {
	if a.inv == nil {
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.warnings)
}
