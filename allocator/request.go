package allocator

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/gpuiso/gpuiso/node"
)

// Request asks for GPUs.
type Request struct {
	// Count is the number of GPUs in all, including Devices. Zero with
	// Devices means exactly Devices.
	Count int `json:"count,omitempty"`
	// Devices must be part of the allocation: indexes, UUIDs or PCI bus ids.
	Devices []string `json:"devices,omitempty"`
	// Model restricts the GPUs to one model: "nvidia/gpu/<model>" as Nomad
	// writes it, or the bare model name.
	Model string `json:"model,omitempty"`
	// Group is the tenant, namespace or role the request counts against
	// (see WithQuota).
	Group string `json:"group,omitempty"`
	// Constraints must hold on every GPU of the allocation.
	Constraints []Constraint `json:"constraints,omitempty"`
	// Affinities steer the choice among the GPUs that satisfy Constraints.
	Affinities []Affinity `json:"affinities,omitempty"`
	// MemoryBytes, when set, asks for that much memory on one shareable GPU
	// (see WithShared) instead of whole GPUs: the memory share
	// Share{Mode: ShareMemory, MemoryBytes: MemoryBytes}. Count must then
	// be 0 or 1.
	//
	// Deprecated: set Share to &Share{Mode: ShareMemory, MemoryBytes: n};
	// it still asks for that share (beside a Share, it must be the same).
	MemoryBytes uint64 `json:"memoryBytes,omitempty"`
	// Share, when set, asks for part of one shareable GPU instead of whole
	// GPUs: a memory share, a time slice or a concurrent slice (see
	// Share). Count must then be
	// 0 or 1; Devices may name the one GPU.
	Share *Share `json:"share,omitempty"`
	// MIG, when set, asks for MIG devices of that GPU-instance profile
	// ("1g.10gb") instead of whole GPUs: Count of them (default 1). GPUs
	// with MIG enabled are handed out only this way, never whole.
	MIG string `json:"mig,omitempty"`
	// MIGMemoryBytes, when set, asks for MIG devices of at least that much
	// memory, the smallest that fit, instead of a profile.
	MIGMemoryBytes uint64 `json:"migMemoryBytes,omitempty"`
	// Holder, when set, is the process whose life the allocation lasts:
	// ReleaseDead frees it once that process is provably gone.
	Holder *Holder `json:"holder,omitempty"`
	// AcceptUnhealthy names devices of Devices (in the same form) that
	// may be handed out although marked unhealthy (MarkUnhealthy): the
	// caller knows and takes them as they are, as an operator's
	// diagnostic of a failed GPU does. Every other device, and every
	// device the allocator chooses itself, is a healthy one, as without
	// it; a device held by another owner is refused all the same. A
	// device named here and not in Devices is an ErrInvalidRequest.
	AcceptUnhealthy []string `json:"acceptUnhealthy,omitempty"`
}

// Allocation is what an owner holds.
type Allocation struct {
	Owner string `json:"owner"`
	Group string `json:"group,omitempty"`
	// Devices are the GPUs, in inventory order; for MIG devices each is
	// its parent's identity with the device's "MIG-" UUID and a MIG part
	// (instance ids and capability nodes).
	Devices []node.DeviceRef `json:"devices"`
	// Shared tells whether this is a slice of one GPU's memory (a memory
	// share).
	//
	// Deprecated: read Share (a memory share is Share.Mode ShareMemory);
	// it is still set.
	Shared bool `json:"shared,omitempty"`
	// MemoryBytes is the memory of a shared allocation.
	//
	// Deprecated: read Share.MemoryBytes; it is still set.
	MemoryBytes uint64 `json:"memoryBytes,omitempty"`
	// Share is the share held, a memory share, a time slice or a
	// concurrent slice (with its memory, the GPU's divided by its count),
	// or nil for whole GPUs and MIG devices.
	Share *Share `json:"share,omitempty"`
	// Holder is the request's Holder, if it had one.
	Holder *Holder `json:"holder,omitempty"`
}

// resolve turns a device reference into a position.
func (a *Allocator) resolve(ref string) (int, error) {
	ref = strings.TrimSpace(ref)
	if i, err := strconv.Atoi(ref); err == nil {
		for p, d := range a.inv.Devices {
			if d.Index == i {
				return p, nil
			}
		}
		return 0, fmt.Errorf("device %q: %w", ref, ErrUnknownDevice)
	}
	for p, d := range a.inv.Devices {
		if d.UUID != "" && strings.EqualFold(d.UUID, ref) {
			return p, nil
		}
	}
	if bus, err := node.NormalizeBusID(ref); err == nil {
		for p, d := range a.inv.Devices {
			if d.BusID == bus {
				return p, nil
			}
		}
	}
	return 0, fmt.Errorf("device %q: %w", ref, ErrUnknownDevice)
}

// compiled is a validated request.
type compiled struct {
	count    int
	must     uint64
	match    uint64 // devices satisfying model and constraints
	affinity []int64
	hasAff   bool
	group    string
	share    *Share
	holder   *Holder
	sick     uint64 // devices of must that may be unhealthy (AcceptUnhealthy)
}

func (a *Allocator) compile(r Request) (compiled, error) {
	c := compiled{group: r.Group}
	share, err := r.share()
	if err != nil {
		return c, err
	}
	c.share = share
	if r.Holder != nil {
		if err := validHolder(*r.Holder); err != nil {
			return c, err
		}
		h := *r.Holder
		c.holder = &h
	}
	if r.Count < 0 {
		return c, fmt.Errorf("count %d: %w", r.Count, ErrInvalidRequest)
	}
	for _, ref := range r.Devices {
		p, err := a.resolve(ref)
		if err != nil {
			return c, err
		}
		if c.must&(1<<p) != 0 {
			return c, fmt.Errorf("device %q: %w", ref, ErrDuplicateDevice)
		}
		c.must |= 1 << p
	}
	for _, ref := range r.AcceptUnhealthy {
		p, err := a.resolve(ref)
		if err != nil {
			return c, err
		}
		if c.must&(1<<p) == 0 {
			return c, fmt.Errorf("device %q accepted unhealthy is not one the request names: %w", ref, ErrInvalidRequest)
		}
		c.sick |= 1 << p
	}
	c.count = r.Count
	if c.count == 0 {
		c.count = len(r.Devices)
	}
	switch {
	case share != nil && c.count > 1:
		return c, fmt.Errorf("shared request for %d GPUs, want one: %w", c.count, ErrInvalidRequest)
	case share != nil:
		c.count = 1
	case c.count == 0:
		return c, fmt.Errorf("zero GPUs: %w", ErrInvalidRequest)
	case c.count < len(r.Devices):
		return c, fmt.Errorf("count %d below the %d devices named: %w", r.Count, len(r.Devices), ErrInvalidRequest)
	case c.count > a.n:
		return c, fmt.Errorf("%d GPUs on a node of %d: %w", c.count, a.n, ErrInvalidRequest)
	}
	if len(r.Group) > node.MaxOwnerLen {
		return c, fmt.Errorf("group name longer than %d bytes: %w", node.MaxOwnerLen, ErrInvalidRequest)
	}
	model, err := modelName(r.Model)
	if err != nil {
		return c, err
	}
	if model != "" && !a.hasModel(model) {
		return c, fmt.Errorf("model %q: no GPU of this node is one: %w", model, ErrInvalidRequest)
	}
	// Each constraint is compiled once, then tested on every device.
	ks := make([]matcher, len(r.Constraints))
	for i, k := range r.Constraints {
		m, err := k.compile()
		if err != nil {
			return c, fmt.Errorf("%w: %w", ErrInvalidRequest, err)
		}
		if err := a.knownAttribute(k); err != nil {
			return c, err
		}
		ks[i] = m
	}
	if len(r.Affinities) > MaxAffinities {
		return c, fmt.Errorf("%d affinities, at most %d: %w", len(r.Affinities), MaxAffinities, ErrInvalidRequest)
	}
	affs := make([]matcher, len(r.Affinities))
	for i, k := range r.Affinities {
		if err := k.validWeight(); err != nil {
			return c, fmt.Errorf("%w: %w", ErrInvalidRequest, err)
		}
		m, err := k.compile()
		if err != nil {
			return c, fmt.Errorf("%w: %w", ErrInvalidRequest, err)
		}
		if err := a.knownAttribute(k.Constraint); err != nil {
			return c, err
		}
		affs[i] = m
	}
	if model == "" && len(r.Constraints) == 0 && len(r.Affinities) == 0 {
		c.match = a.all
		return c, nil
	}
	if len(r.Affinities) > 0 {
		c.affinity = make([]int64, a.n)
	}
	for p := range a.n {
		d := &a.inv.Devices[p]
		ok := model == "" || strings.EqualFold(d.Model, model)
		for _, k := range ks {
			ok = ok && k.matches(d)
		}
		if ok {
			c.match |= 1 << p
		}
		for i, k := range affs {
			if k.matches(d) {
				c.affinity[p] += int64(r.Affinities[i].Weight)
				c.hasAff = true
			}
		}
	}
	return c, nil
}

func describe(r Request) string {
	if s, err := r.share(); err == nil && s != nil && isMIGRequest(r) {
		return "a share of " + s.String() + " of a mig device"
	}
	if isMIGRequest(r) {
		n := max(r.Count, len(r.Devices), 1)
		what := r.MIG
		if what == "" && r.MIGMemoryBytes > 0 {
			what = fmt.Sprintf(">= %d bytes", r.MIGMemoryBytes)
		}
		if what == "" {
			return fmt.Sprintf("%d mig devices", n)
		}
		return fmt.Sprintf("%d mig devices of %s", n, what)
	}
	if s, err := r.share(); err == nil && s != nil {
		switch s.Mode {
		case ShareTime:
			return "a time slice of a gpu"
		case ShareSlice:
			return s.String() + " of a gpu"
		}
		return "a share of " + s.String() + " of a gpu"
	}
	if r.MemoryBytes > 0 || r.Share != nil {
		return "a share of a gpu"
	}
	n := r.Count
	if n == 0 {
		n = len(r.Devices)
	}
	if n == 1 {
		return "1 gpu"
	}
	return fmt.Sprintf("%d gpus", n)
}
