package allocator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"

	"github.com/gpuiso/gpuiso/node"
)

// ErrUnknownMIGProfile: a request names a MIG profile that no GPU of the
// node has, or a minimum MIG memory that no instance reaches.
var ErrUnknownMIGProfile = node.Sentinel(node.ErrInvalid, "unknown MIG profile")

// migTable is the allocator's view of the node's MIG devices: every MIG
// device of every GPU with MIG enabled, by unit number (position order, then
// the parent's order), with who holds it and its own health.
type migTable struct {
	units   []migUnit
	owner   []string      // by unit: the holder, or ""
	health  []node.Health // by unit: the instance's own health
	parents uint64        // positions of the GPUs with MIG enabled
	// shares are the shares of MIG devices: by unit, its sharers' memory
	// by owner (migshare.go).
	shares map[int]map[string]uint64
}

type migUnit struct {
	pos     int // the parent's position
	dev     node.MIGDevice
	dynamic bool // created on demand (WithMIGManager): destroyed on release
	gone    bool // a destroyed dynamic device's slot, free for the next
}

// initMIG builds the MIG table from the inventory. A GPU with MIG enabled
// is handed out only by its MIG devices: never whole, never shared.
func (a *Allocator) initMIG() error {
	for p, d := range a.inv.Devices {
		if !d.MIGSplit() {
			continue
		}
		a.mig.parents |= 1 << p
		if a.shares[p] != nil {
			return fmt.Errorf("%s has MIG enabled and cannot be shared by memory: %w", a.name(p), ErrInvalidRequest)
		}
		for _, m := range d.MIGDevices {
			a.mig.units = append(a.mig.units, migUnit{pos: p, dev: m})
			h := m.Health
			if h == (node.Health{}) {
				h = node.Healthy()
			}
			a.mig.health = append(a.mig.health, h)
		}
	}
	a.mig.owner = make([]string, len(a.mig.units))
	a.mig.shares = map[int]map[string]uint64{}
	return nil
}

// migUnitOf finds a MIG device by its UUID.
func (a *Allocator) migUnitOf(uuid string) (int, bool) {
	for k, u := range a.mig.units {
		if !u.gone && strings.EqualFold(u.dev.UUID, strings.TrimSpace(uuid)) {
			return k, true
		}
	}
	return 0, false
}

// migUsable tells whether unit k may be handed out: free, and it and its
// parent healthy.
func (a *Allocator) migUsable(k int) bool {
	u := a.mig.units[k]
	return !u.gone && a.mig.owner[k] == "" && len(a.mig.shares[k]) == 0 && a.mig.health[k].Healthy && a.health[u.pos].Healthy
}

// isMIGRequest tells whether r asks for MIG devices.
func isMIGRequest(r Request) bool {
	return r.MIG != "" || r.MIGMemoryBytes > 0 || slices.ContainsFunc(r.Devices, func(s string) bool { return node.IsMIGUUID(strings.TrimSpace(s)) })
}

// allocateMIG serves a request for MIG devices: Count devices (default one,
// or the devices named) of profile r.MIG, or of at least r.MIGMemoryBytes,
// on GPUs matching the request's model and constraints.
func (a *Allocator) allocateMIG(ctx context.Context, owner string, r Request) (Allocation, error) {
	match, err := a.compileMIG(r)
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
	units, err := a.placeMIG(match)
	var created []int // MIG devices created for this request (WithMIGManager)
	var short *InsufficientError
	if err != nil && a.cfg.migManager != nil && match.profile != "" && len(match.must) == 0 && errors.As(err, &short) {
		created, err = a.createMIG(ctx, match, short.Requested-short.Free)
		if err == nil {
			units, err = a.placeMIG(match)
		}
	}
	undo := func() {
		if derr := a.destroyUnits(ctx, created); derr != nil {
			err = errors.Join(err, derr)
		}
	}
	if err != nil {
		undo()
		return Allocation{}, err
	}
	h := &holding{group: r.Group, shared: -1, mig: units}
	if err = a.checkQuota(owner, h); err != nil {
		undo()
		return Allocation{}, err
	}
	a.apply(owner, h)
	if err = a.persist(ctx, func() { a.apply(owner, nil) }); err != nil {
		undo()
		return Allocation{}, err
	}
	if a.cfg.logger.Enabled(ctx, slog.LevelDebug) {
		a.cfg.logger.Debug("allocated MIG devices", "owner", owner, "mig", a.migUUIDs(units))
	}
	return a.allocation(owner, h), nil
}

// migMatch is a validated MIG request.
type migMatch struct {
	count   int
	profile string
	memory  uint64
	must    []int  // units named by UUID
	sick    []int  // units of must that may be unhealthy (AcceptUnhealthy)
	parents uint64 // positions whose GPU matches model and constraints
}

func (a *Allocator) compileMIG(r Request) (migMatch, error) {
	m := migMatch{count: r.Count, profile: strings.TrimSpace(r.MIG), memory: r.MIGMemoryBytes}
	switch {
	case r.Count < 0:
		return m, fmt.Errorf("count %d: %w", r.Count, ErrInvalidRequest)
	case (r.MemoryBytes > 0 || r.Share != nil) && r.MIG == "" && r.MIGMemoryBytes == 0:
		// A share naming MIG devices: MPS could share one, but the
		// allocator hands MIG devices out whole.
		return m, fmt.Errorf("a share of a MIG device (ask for the MIG device whole, or share a GPU without MIG): %w", ErrShareNotSupported)
	case r.MemoryBytes > 0 || r.Share != nil:
		return m, fmt.Errorf("a MIG request cannot also ask for a share: %w", ErrInvalidRequest)
	case m.profile != "" && m.memory > 0:
		return m, fmt.Errorf("a MIG request names a profile or a memory, not both: %w", ErrInvalidRequest)
	case len(r.Affinities) > 0:
		return m, fmt.Errorf("affinities do not apply to MIG devices: %w", ErrInvalidRequest)
	case len(r.Group) > node.MaxOwnerLen:
		return m, fmt.Errorf("group name longer than %d bytes: %w", node.MaxOwnerLen, ErrInvalidRequest)
	}
	for _, ref := range r.Devices {
		k, ok := a.migUnitOf(ref)
		if !ok {
			if node.IsMIGUUID(strings.TrimSpace(ref)) {
				return m, fmt.Errorf("MIG device %q: %w", ref, ErrUnknownDevice)
			}
			return m, fmt.Errorf("device %q: a request takes whole GPUs or MIG devices, not both: %w", ref, ErrInvalidRequest)
		}
		if slices.Contains(m.must, k) {
			return m, fmt.Errorf("device %q: %w", ref, ErrDuplicateDevice)
		}
		m.must = append(m.must, k)
	}
	for _, ref := range r.AcceptUnhealthy {
		k, ok := a.migUnitOf(ref)
		if !ok || !slices.Contains(m.must, k) {
			return m, fmt.Errorf("device %q accepted unhealthy is not one the request names: %w", ref, ErrInvalidRequest)
		}
		m.sick = append(m.sick, k)
	}
	if m.count == 0 {
		m.count = max(len(m.must), 1)
	}
	if m.count < len(m.must) {
		return m, fmt.Errorf("count %d below the %d devices named: %w", r.Count, len(m.must), ErrInvalidRequest)
	}
	if m.count > len(a.mig.units) {
		return m, &InsufficientError{Requested: m.count, Free: a.freeMIGCount()}
	}
	if m.profile != "" && !slices.ContainsFunc(a.inv.Devices, func(d node.Device) bool { _, ok := d.MIGProfile(m.profile); return ok }) &&
		!slices.ContainsFunc(a.mig.units, func(u migUnit) bool { return u.dev.Profile == m.profile }) {
		return m, fmt.Errorf("%q: %w", m.profile, ErrUnknownMIGProfile)
	}
	model, err := modelName(r.Model)
	if err != nil {
		return m, err
	}
	ks := make([]matcher, len(r.Constraints))
	for i, k := range r.Constraints {
		km, err := k.compile()
		if err != nil {
			return m, fmt.Errorf("%w: %w", ErrInvalidRequest, err)
		}
		ks[i] = km
	}
	for p := range a.n {
		d := &a.inv.Devices[p]
		ok := model == "" || strings.EqualFold(d.Model, model)
		for _, k := range ks {
			ok = ok && k.matches(d)
		}
		if ok {
			m.parents |= 1 << p
		}
	}
	return m, nil
}

// fits tells whether unit k is the kind of MIG device m asks for.
func (a *Allocator) fits(k int, m migMatch) bool {
	u := a.mig.units[k]
	switch {
	case m.parents&(1<<u.pos) == 0:
		return false
	case m.profile != "":
		return u.dev.Profile == m.profile
	case m.memory > 0:
		return u.dev.MemoryBytes >= m.memory
	}
	return true
}

// placeMIG chooses m.count MIG devices: the named ones, then one at a time
// the device on the parent with the most MIG devices already held (so whole
// parents stay free), the smallest that fits a memory request (best fit),
// then on the parent with the fewest free devices left, then the lowest
// parent and instance. The caller holds a.mu.
func (a *Allocator) placeMIG(m migMatch) ([]int, error) {
	chosen := slices.Clone(m.must)
	for _, k := range m.must {
		usable := a.migUsable(k) || slices.Contains(m.sick, k) && !a.mig.units[k].gone && a.mig.owner[k] == "" && len(a.mig.shares[k]) == 0
		if !usable || !a.fits(k, m) {
			return nil, fmt.Errorf("MIG device %s: %s: %w", a.mig.units[k].dev.UUID, a.whyMIG(k, m), ErrDeviceUnavailable)
		}
	}
	var cands []int
	for k := range a.mig.units {
		if !slices.Contains(chosen, k) && a.migUsable(k) && a.fits(k, m) {
			cands = append(cands, k)
		}
	}
	if len(chosen)+len(cands) < m.count {
		return nil, &InsufficientError{Requested: m.count, Free: len(chosen) + len(cands)}
	}
	held := map[int]int{} // parent position -> MIG devices held, counting the chosen
	free := map[int]int{} // parent position -> MIG devices free
	for k, u := range a.mig.units {
		if a.mig.owner[k] != "" || slices.Contains(chosen, k) {
			held[u.pos]++
		} else if a.migUsable(k) {
			free[u.pos]++
		}
	}
	for len(chosen) < m.count {
		sort.SliceStable(cands, func(i, j int) bool {
			ui, uj := a.mig.units[cands[i]], a.mig.units[cands[j]]
			if m.memory > 0 && ui.dev.MemoryBytes != uj.dev.MemoryBytes {
				return ui.dev.MemoryBytes < uj.dev.MemoryBytes
			}
			if held[ui.pos] != held[uj.pos] {
				return held[ui.pos] > held[uj.pos]
			}
			if free[ui.pos] != free[uj.pos] {
				return free[ui.pos] < free[uj.pos]
			}
			return cands[i] < cands[j]
		})
		k := cands[0]
		cands = cands[1:]
		chosen = append(chosen, k)
		held[a.mig.units[k].pos]++
		free[a.mig.units[k].pos]--
	}
	slices.Sort(chosen)
	return chosen, nil
}

// whyMIG says why unit k cannot serve m.
func (a *Allocator) whyMIG(k int, m migMatch) string {
	u := a.mig.units[k]
	switch {
	case a.mig.owner[k] != "":
		return "owned by " + a.mig.owner[k]
	case len(a.mig.shares[k]) > 0:
		return fmt.Sprintf("shared by %d owners", len(a.mig.shares[k]))
	case !a.health[u.pos].Healthy:
		return "parent " + a.health[u.pos].String()
	case !a.mig.health[k].Healthy:
		return a.mig.health[k].String()
	case !a.fits(k, m):
		return "does not match the request's profile, memory, model or constraints"
	}
	return "not free"
}

// applyMIG moves MIG devices from old (may be nil) to owner's new holding
// h (may be nil). The caller holds a.mu.
func (a *Allocator) applyMIG(owner string, old, h *holding) {
	if old != nil {
		for _, k := range old.mig {
			a.mig.owner[k] = ""
		}
	}
	if h != nil {
		for _, k := range h.mig {
			a.mig.owner[k] = owner
		}
	}
}

// migParentsOf is the mask of the parents of units.
func (a *Allocator) migParentsOf(units []int) uint64 {
	var m uint64
	for _, k := range units {
		m |= 1 << a.mig.units[k].pos
	}
	return m
}

// migRefs are the allocation's references to units: each its parent's
// identity with the MIG device's UUID and MIG data.
func (a *Allocator) migRefs(units []int) []node.DeviceRef {
	out := make([]node.DeviceRef, 0, len(units))
	for _, k := range units {
		u := a.mig.units[k]
		out = append(out, a.inv.Devices[u.pos].MIGRef(u.dev))
	}
	return out
}

func (a *Allocator) migUUIDs(units []int) []string {
	out := make([]string, len(units))
	for i, k := range units {
		out[i] = a.mig.units[k].dev.UUID
	}
	return out
}

// migOwnersOf are the owners of parent p's MIG devices.
func (a *Allocator) migOwnersOf(p int) []string {
	var out []string
	for k, u := range a.mig.units {
		if !u.gone && u.pos == p && a.mig.owner[k] != "" && !slices.Contains(out, a.mig.owner[k]) {
			out = append(out, a.mig.owner[k])
		}
		if !u.gone && u.pos == p {
			for _, o := range a.migShareOwners(k) {
				if !slices.Contains(out, o) {
					out = append(out, o)
				}
			}
		}
	}
	sort.Strings(out)
	return out
}

func (a *Allocator) freeMIGCount() int {
	n := 0
	for k := range a.mig.units {
		if a.migUsable(k) {
			n++
		}
	}
	return n
}

// setMIGHealth sets the health of MIG device k and returns its owner.
func (a *Allocator) setMIGHealth(ctx context.Context, k int, h node.Health) ([]string, error) {
	old := a.mig.health[k]
	a.mig.health[k] = h
	if err := a.persist(ctx, func() { a.mig.health[k] = old }); err != nil {
		return nil, err
	}
	a.cfg.logger.Info("MIG device health", "device", a.mig.units[k].dev.UUID, "health", h.String())
	if o := a.mig.owner[k]; o != "" {
		return []string{o}, nil
	}
	owners := a.migShareOwners(k)
	slices.Sort(owners)
	return owners, nil
}

// withMIGHealth writes the allocator's health of parent p's MIG devices
// into d (a copy).
func (a *Allocator) withMIGHealth(p int, d *node.Device) {
	if a.mig.parents&(1<<p) == 0 {
		return
	}
	d.MIGDevices = slices.Clone(d.MIGDevices)
	for k, u := range a.mig.units {
		if u.pos != p {
			continue
		}
		for i := range d.MIGDevices {
			if d.MIGDevices[i].UUID == u.dev.UUID {
				d.MIGDevices[i].Health = a.mig.health[k]
			}
		}
	}
}

// FreeMIG returns copies of the MIG devices that may be handed out now.
func (a *Allocator) FreeMIG() []node.MIGDevice {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []node.MIGDevice
	for k, u := range a.mig.units {
		if a.migUsable(k) {
			out = append(out, u.dev)
		}
	}
	return out
}

// checkMIGInvariants: every MIG device held by at most one owner, agreeing
// with the owners' holdings, no holding mixing whole GPUs, shares and MIG
// devices, and no GPU with MIG enabled held whole or shared. The caller
// holds a.mu.
func (a *Allocator) checkMIGInvariants() error {
	held := make([]string, len(a.mig.units))
	if err := a.checkMIGShareInvariants(); err != nil {
		return err
	}
	for o, h := range a.owners {
		if len(h.mig) > 0 && (h.devices != 0 || h.shared >= 0) {
			return fmt.Errorf("owner %s holds MIG devices beside whole or shared GPUs", o)
		}
		if h.devices&a.mig.parents != 0 && (a.cfg.migManager == nil || h.devices&a.migParentsOf(a.liveUnits()) != 0) {
			return fmt.Errorf("owner %s holds a GPU with MIG enabled whole, beside its MIG devices", o)
		}
		if h.shared >= 0 && a.mig.parents&(1<<h.shared) != 0 {
			return fmt.Errorf("owner %s shares a GPU with MIG enabled", o)
		}
		for _, k := range h.mig {
			if held[k] != "" {
				return fmt.Errorf("MIG device %s held by %s and %s", a.mig.units[k].dev.UUID, held[k], o)
			}
			held[k] = o
		}
	}
	for k, o := range a.mig.owner {
		if a.mig.units[k].gone && o != "" {
			return fmt.Errorf("a destroyed MIG device is held by %s", o)
		}
		if held[k] != o {
			return fmt.Errorf("MIG device %s says %q, owners say %q", a.mig.units[k].dev.UUID, o, held[k])
		}
	}
	return nil
}
