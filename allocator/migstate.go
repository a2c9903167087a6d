package allocator

import (
	"fmt"
	"slices"

	"github.com/gpuiso/gpuiso/node"
)

// savedMIG is a MIG device in the state file: named by its "MIG-" UUID,
// which is stable while the GPU's layout stands; the parent and instance
// ids are informative.
type savedMIG struct {
	UUID       string `json:"uuid"`
	ParentUUID string `json:"parentUuid,omitempty"`
	GI         int    `json:"gi"`
	CI         int    `json:"ci"`
	Profile    string `json:"profile,omitempty"`
	// Dynamic marks a device created on demand, destroyed on release.
	Dynamic bool `json:"dynamic,omitempty"`
}

type savedMIGHealth struct {
	UUID   string `json:"uuid"`
	Reason string `json:"reason"`
}

func (a *Allocator) savedMIGs(units []int) []savedMIG {
	var out []savedMIG
	for _, k := range units {
		d := a.mig.units[k].dev
		out = append(out, savedMIG{UUID: d.UUID, ParentUUID: d.ParentUUID, GI: d.GI, CI: d.CI, Profile: d.Profile, Dynamic: a.mig.units[k].dynamic})
	}
	return out
}

func (a *Allocator) savedMIGHealth() []savedMIGHealth {
	var out []savedMIGHealth
	for k, h := range a.mig.health {
		if !h.Healthy && !a.mig.units[k].gone {
			out = append(out, savedMIGHealth{UUID: a.mig.units[k].dev.UUID, Reason: h.Reason})
		}
	}
	return out
}

// restoreMIG gives h the saved MIG devices of so. One that is no longer in
// the inventory (the layout changed) is dropped with a warning; one held
// twice makes the state corrupt.
func (a *Allocator) restoreMIG(so savedOwner, h *holding, warn func(string, ...any)) error {
	for _, m := range so.MIG {
		k, ok := a.migUnitOf(m.UUID)
		if !ok {
			warn("owner %s: MIG device %s (gpu %s gi %d ci %d) is not in the inventory: dropped", so.Owner, m.UUID, m.ParentUUID, m.GI, m.CI)
			continue
		}
		if a.mig.owner[k] != "" || len(a.mig.shares[k]) > 0 {
			return fmt.Errorf("MIG device %s held twice: %w", m.UUID, ErrCorruptState)
		}
		a.mig.owner[k] = so.Owner
		a.mig.units[k].dynamic = m.Dynamic
		h.mig = append(h.mig, k)
	}
	slices.Sort(h.mig)
	return nil
}

func (a *Allocator) restoreMIGHealth(saved []savedMIGHealth) {
	for _, s := range saved {
		if k, ok := a.migUnitOf(s.UUID); ok {
			a.mig.health[k] = node.Unhealthy(s.Reason)
		}
	}
}
