package allocator

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
)

// Shares of MIG devices.
//
// A MIG device is shared as a GPU without MIG is: by memory shares, time
// slices or concurrent slices of one count, never by two of these at once
// and never while an owner holds it whole; and while it holds shares it is
// not handed out whole. Its own memory is the capacity its shares divide.
// A request asks for a share of a MIG device by giving Share beside a MIG
// selection (Request.MIG, Request.MIGMemoryBytes or one MIG device named
// in Request.Devices); a claim names the MIG device (Claim with AsShare).
// A share of a MIG device never creates one (WithMIGManager): it takes
// one that exists.

// migShare is the unit of the MIG device h shares, if h is a share of
// one.
func (h *holding) migShare() (int, bool) {
	return h.sharedMIG - 1, h.sharedMIG > 0
}

// migShareMode is the mode of the shares MIG device k holds, or "".
func (a *Allocator) migShareMode(k int) ShareMode {
	for o := range a.mig.shares[k] {
		if h := a.owners[o]; h != nil {
			return h.mode
		}
	}
	return ""
}

// migSlicesOn is the number of concurrent slices MIG device k holds and
// their count, or 0, 0.
func (a *Allocator) migSlicesOn(k int) (held, count int) {
	for o := range a.mig.shares[k] {
		if h := a.owners[o]; h != nil && h.mode == ShareSlice {
			held, count = held+1, h.slices
		}
	}
	return held, count
}

// migFreeMemory is the memory of MIG device k that its shares leave.
func (a *Allocator) migFreeMemory(k int) uint64 {
	var used uint64
	for _, m := range a.mig.shares[k] {
		used += m
	}
	total := a.mig.units[k].dev.MemoryBytes
	if used >= total {
		return 0
	}
	return total - used
}

// migSliceMemory is the memory of one of n slices of MIG device k.
func (a *Allocator) migSliceMemory(k, n int) uint64 {
	return a.mig.units[k].dev.MemoryBytes / uint64(n)
}

// fitsMIGShare says why MIG device k cannot take share s, or "" when it
// can; sick says it may be unhealthy.
func (a *Allocator) fitsMIGShare(k int, s Share, sick bool) string {
	u := a.mig.units[k]
	switch {
	case u.gone:
		return "destroyed"
	case a.mig.owner[k] != "":
		return "owned by " + a.mig.owner[k]
	case !sick && !a.health[u.pos].Healthy:
		return "parent " + a.health[u.pos].String()
	case !sick && !a.mig.health[k].Healthy:
		return a.mig.health[k].String()
	}
	if m := a.migShareMode(k); m != "" && m != s.mode() {
		return "held by " + string(m) + " shares"
	}
	switch s.mode() {
	case ShareTime:
		if n := len(a.mig.shares[k]); n >= a.timeSliceLimit() {
			return fmt.Sprintf("%d of %d time slices taken", n, a.timeSliceLimit())
		}
	case ShareSlice:
		held, count := a.migSlicesOn(k)
		switch {
		case held > 0 && count != s.Slices:
			return fmt.Sprintf("split in %d slices, not %d", count, s.Slices)
		case held >= s.Slices:
			return fmt.Sprintf("%d of %d slices taken", held, s.Slices)
		case a.migSliceMemory(k, s.Slices) < 1<<20:
			return fmt.Sprintf("%s: too little memory for %d slices", FormatBytes(u.dev.MemoryBytes), s.Slices)
		}
	default:
		if free := a.migFreeMemory(k); free < s.MemoryBytes {
			return FormatBytes(free) + " free"
		}
	}
	return ""
}

// migShareHolding is the holding of share s on MIG device k.
func (a *Allocator) migShareHolding(k int, s Share, group string, holder *Holder) *holding {
	h := &holding{group: group, shared: -1, sharedMIG: k + 1, mode: s.mode(), memory: s.MemoryBytes, compute: s.ComputePercent, slices: s.Slices, holder: holder}
	if h.mode == ShareSlice {
		h.memory = a.migSliceMemory(k, s.Slices)
	}
	return h
}

// allocateMIGShare serves a request for a share of a MIG device: among the
// MIG devices the request's selection takes, it packs as placeShare does
// (the fullest MIG device already holding shares of s's mode that has
// room), and only then opens a free MIG device, chosen as placeMIG
// chooses one.
func (a *Allocator) allocateMIGShare(ctx context.Context, owner string, r Request, s Share) (Allocation, error) {
	if r.Count > 1 {
		return Allocation{}, fmt.Errorf("a share of %d MIG devices: a share is of one: %w", r.Count, ErrInvalidRequest)
	}
	sel := r
	sel.Share, sel.MemoryBytes, sel.Count = nil, 0, 1
	m, err := a.compileMIG(sel)
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
	k, err := a.placeMIGShare(m, s)
	if err != nil {
		return Allocation{}, err
	}
	h := a.migShareHolding(k, s, r.Group, nil)
	if err := a.checkQuota(owner, h); err != nil {
		return Allocation{}, err
	}
	a.apply(owner, h)
	if err := a.persist(ctx, func() { a.apply(owner, nil) }); err != nil {
		return Allocation{}, err
	}
	if a.cfg.logger.Enabled(ctx, slog.LevelDebug) {
		a.cfg.logger.Debug("allocated a share of a MIG device", "owner", owner, "mig", a.mig.units[k].dev.UUID, "share", s.String())
	}
	return a.allocation(owner, h), nil
}

// placeMIGShare chooses the MIG device for share s among those m takes.
// The caller holds a.mu.
func (a *Allocator) placeMIGShare(m migMatch, s Share) (int, error) {
	if len(m.must) > 0 {
		k := m.must[0]
		if !a.fits(k, m) {
			return 0, fmt.Errorf("MIG device %s: does not match the request's model or constraints: %w", a.mig.units[k].dev.UUID, ErrDeviceUnavailable)
		}
		if why := a.fitsMIGShare(k, s, len(m.sick) > 0); why != "" {
			return 0, fmt.Errorf("MIG device %s: %s: %w", a.mig.units[k].dev.UUID, why, ErrDeviceUnavailable)
		}
		return k, nil
	}
	best, bestKey, any := -1, uint64(0), false
	for k := range a.mig.units {
		if !a.fits(k, m) || a.mig.units[k].gone {
			continue
		}
		if s.mode() == ShareMemory && a.mig.units[k].dev.MemoryBytes >= s.MemoryBytes {
			any = true
		} else if s.mode() != ShareMemory {
			any = true
		}
		if len(a.mig.shares[k]) == 0 || a.fitsMIGShare(k, s, false) != "" {
			continue
		}
		key := a.migFreeMemory(k)
		switch s.mode() {
		case ShareTime:
			key = uint64(a.timeSliceLimit() - len(a.mig.shares[k]))
		case ShareSlice:
			held, _ := a.migSlicesOn(k)
			key = uint64(s.Slices - held)
		}
		if best < 0 || key < bestKey {
			best, bestKey = k, key
		}
	}
	if best >= 0 {
		return best, nil
	}
	if !any {
		return 0, fmt.Errorf("a share of %s of a MIG device: no MIG device of the request's selection could take it: %w", s, ErrInvalidRequest)
	}
	// Open a free MIG device with room: placeMIG's choice among them.
	open := m
	open.count = 1
	if s.mode() == ShareMemory {
		open.memory = max(open.memory, s.MemoryBytes)
	}
	units, err := a.placeMIG(open)
	if err == nil && a.fitsMIGShare(units[0], s, false) == "" {
		return units[0], nil
	}
	e := &ShareError{Share: s}
	for k, u := range a.mig.units {
		if u.gone || !a.fits(k, m) {
			continue
		}
		f := ShareFit{Index: a.inv.Devices[u.pos].Index, UUID: u.dev.UUID, Reason: a.fitsMIGShare(k, s, false)}
		if f.Reason == "" {
			f.Reason = "not chosen"
		}
		if a.mig.owner[k] == "" && s.mode() == ShareMemory {
			f.FreeBytes = a.migFreeMemory(k)
		}
		e.GPUs = append(e.GPUs, f)
	}
	return 0, e
}

// claimMIGShare makes owner hold share s of MIG device k, as claimShare
// does for a GPU. The caller holds a.mu.
func (a *Allocator) claimMIGShare(ctx context.Context, owner string, k int, s Share, o claimOptions) (Allocation, error) {
	if s.Mode == ShareSlice {
		if want := a.migSliceMemory(k, s.Slices); s.MemoryBytes != 0 && s.MemoryBytes != want {
			return Allocation{}, fmt.Errorf("MIG device %s: a slice of %d is %s, not %s: %w", a.mig.units[k].dev.UUID, s.Slices, FormatBytes(want), FormatBytes(s.MemoryBytes), ErrInvalidRequest)
		}
	}
	h := a.migShareHolding(k, s, "", o.holder)
	if old, ok := a.owners[owner]; ok {
		if old.sharedMIG != h.sharedMIG || old.mode != h.mode || old.memory != h.memory || old.compute != h.compute || old.slices != h.slices {
			return Allocation{}, &ClaimError{Owner: owner, Held: refNames(a.allocation(owner, old).Devices), Claimed: refNames(a.migRefs([]int{k}))}
		}
		return a.rehold(ctx, owner, old, o.holder)
	}
	if why := a.fitsMIGShare(k, s, true); why != "" {
		return Allocation{}, fmt.Errorf("MIG device %s: %s: %w", a.mig.units[k].dev.UUID, why, ErrDeviceUnavailable)
	}
	if err := a.checkQuota(owner, h); err != nil {
		return Allocation{}, err
	}
	a.apply(owner, h)
	if err := a.persist(ctx, func() { a.apply(owner, nil) }); err != nil {
		return Allocation{}, err
	}
	return a.allocation(owner, h), nil
}

// applyMIGShare moves owner's share of a MIG device from old to h (either
// may be nil or hold none). The caller holds a.mu.
func (a *Allocator) applyMIGShare(owner string, old, h *holding) {
	if old != nil {
		if k, ok := old.migShare(); ok {
			delete(a.mig.shares[k], owner)
			if len(a.mig.shares[k]) == 0 {
				delete(a.mig.shares, k)
			}
		}
	}
	if h != nil {
		if k, ok := h.migShare(); ok {
			if a.mig.shares[k] == nil {
				a.mig.shares[k] = map[string]uint64{}
			}
			a.mig.shares[k][owner] = h.memory
		}
	}
}

// migShareParent is the mask of the parent of the MIG device h shares, or
// 0.
func (a *Allocator) migShareParent(h *holding) uint64 {
	if k, ok := h.migShare(); ok {
		return 1 << a.mig.units[k].pos
	}
	return 0
}

// migShareOwners are the owners of the shares of MIG device k.
func (a *Allocator) migShareOwners(k int) []string {
	out := make([]string, 0, len(a.mig.shares[k]))
	for o := range a.mig.shares[k] {
		out = append(out, o)
	}
	return out
}

// restoreMIGShare gives h the saved share of a MIG device of so: one MIG
// device, with the share's fields. One no longer in the inventory is
// dropped with a warning; one held whole, by shares of another mode or
// count, or over its memory makes the state corrupt.
func (a *Allocator) restoreMIGShare(so savedOwner, h *holding, warn func(string, ...any)) error {
	m := so.MIG[0]
	k, ok := a.migUnitOf(m.UUID)
	if !ok {
		warn("owner %s: shared MIG device %s (gpu %s gi %d ci %d) is not in the inventory: dropped", so.Owner, m.UUID, m.ParentUUID, m.GI, m.CI)
		return nil
	}
	s := Share{Mode: so.ShareMode, MemoryBytes: so.MemoryBytes, ComputePercent: so.ComputePercent, Slices: so.Slices}
	s.Mode = s.mode()
	if a.mig.owner[k] != "" {
		return fmt.Errorf("MIG device %s both shared and held whole: %w", m.UUID, ErrCorruptState)
	}
	if mode := a.migShareMode(k); mode != "" && mode != s.Mode {
		return fmt.Errorf("MIG device %s held by both %s and %s shares: %w", m.UUID, mode, s.Mode, ErrCorruptState)
	}
	if s.Mode == ShareSlice {
		held, count := a.migSlicesOn(k)
		if held > 0 && count != s.Slices {
			return fmt.Errorf("MIG device %s split in both %d and %d slices: %w", m.UUID, count, s.Slices, ErrCorruptState)
		}
		if held >= s.Slices {
			return fmt.Errorf("MIG device %s holds more than %d slices of %d: %w", m.UUID, s.Slices, s.Slices, ErrCorruptState)
		}
	}
	next := a.migShareHolding(k, s, h.group, h.holder)
	*h = *next
	a.applyMIGShare(so.Owner, nil, h)
	if a.migFreeMemory(k) == 0 && s.Mode == ShareMemory {
		var used uint64
		for _, b := range a.mig.shares[k] {
			used += b
		}
		if used > a.mig.units[k].dev.MemoryBytes {
			return fmt.Errorf("MIG device %s shares more memory than it has: %w", m.UUID, ErrCorruptState)
		}
	}
	a.mig.units[k].dynamic = a.mig.units[k].dynamic || m.Dynamic
	return nil
}

// checkMIGShareInvariants: each share of a MIG device agrees with its
// owner's holding; a MIG device holds shares of one mode (slices of one
// count, at most that many), within its memory, and is not held whole.
func (a *Allocator) checkMIGShareInvariants() error {
	for o, h := range a.owners {
		k, ok := h.migShare()
		if !ok {
			continue
		}
		if h.devices != 0 || h.shared >= 0 || len(h.mig) > 0 {
			return fmt.Errorf("owner %s holds a share of a MIG device beside other devices", o)
		}
		if got, ok := a.mig.shares[k][o]; !ok || got != h.memory {
			return fmt.Errorf("owner %s: MIG device share mismatch", o)
		}
	}
	for k, owners := range a.mig.shares {
		if a.mig.owner[k] != "" {
			return fmt.Errorf("MIG device %s both held whole and shared", a.mig.units[k].dev.UUID)
		}
		var used uint64
		var mode ShareMode
		held, count := 0, 0
		for o, m := range owners {
			h := a.owners[o]
			if k2, ok := h.migShare(); h == nil || !ok || k2 != k {
				return fmt.Errorf("MIG device %s shared by unknown %s", a.mig.units[k].dev.UUID, o)
			}
			if mode != "" && h.mode != mode {
				return fmt.Errorf("MIG device %s held by both %s and %s shares", a.mig.units[k].dev.UUID, mode, h.mode)
			}
			mode, used = h.mode, used+m
			if h.mode == ShareSlice {
				if held > 0 && h.slices != count {
					return fmt.Errorf("MIG device %s split in both %d and %d slices", a.mig.units[k].dev.UUID, count, h.slices)
				}
				held, count = held+1, h.slices
			}
		}
		if used > a.mig.units[k].dev.MemoryBytes || (count > 0 && held > count) {
			return fmt.Errorf("MIG device %s holds more shares than it has room for", a.mig.units[k].dev.UUID)
		}
	}
	return nil
}

// migSharesOf returns the allocations of the shares of MIG device id,
// sorted by owner. The caller holds a.mu.
func (a *Allocator) migSharesOf(id string) ([]Allocation, error) {
	k, ok := a.migUnitOf(id)
	if !ok {
		return nil, fmt.Errorf("shares: MIG device %q: %w", strings.TrimSpace(id), ErrUnknownDevice)
	}
	owners := a.migShareOwners(k)
	slices.Sort(owners)
	out := make([]Allocation, 0, len(owners))
	for _, o := range owners {
		out = append(out, a.allocation(o, a.owners[o]))
	}
	return out, nil
}

// isMIGShareRequest tells whether r asks for a share of a MIG device: a
// share beside a MIG selection.
func isMIGShareRequest(r Request) bool {
	return (r.Share != nil || r.MemoryBytes > 0) && isMIGRequest(r)
}
