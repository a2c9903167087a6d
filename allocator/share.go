package allocator

import (
	"context"
	"fmt"
	"log/slog"
	"math/bits"
	"slices"
	"strconv"
	"strings"

	"github.com/gpuiso/gpuiso/node"
)

// ShareMode is how a share holds part of one GPU.
type ShareMode string

// Share modes.
const (
	// ShareMemory is a slice of one GPU's memory, and optionally a
	// percentage of its compute: the allocator counts the memory, and an
	// MPS control daemon (package isolator/mps) holds the container to it.
	ShareMemory ShareMode = "memory"
	// ShareTime is a time slice: the GPU whole, beside the other time
	// slices of it, isolated from none of them (as NVIDIA's time-slicing
	// replicas). At most the allocator's time-slice count (WithTimeSlices)
	// share one GPU.
	ShareTime ShareMode = "time"
	// ShareSlice is a concurrent slice: one of Share.Slices equal parts of
	// one GPU, whose containers run their kernels at once, as clients of
	// one MPS control daemon (package isolator/mps), each held to the
	// GPU's memory and compute divided by Slices. A GPU split into N
	// slices holds at most N, all of count N.
	ShareSlice ShareMode = "slice"
)

// Bounds of a concurrent slice's count (Share.Slices): a GPU split in two
// at least, and in MaxSlices at most, the most client processes one MPS
// server takes on a GPU since Volta (each slice is one client at least).
const (
	MinSlices = 2
	MaxSlices = 48
)

// DefaultTimeSlices is how many time slices share one GPU at most, unless
// WithTimeSlices says otherwise.
const DefaultTimeSlices = 4

// Share asks for part of one GPU, on a GPU made shareable with WithShared:
// a memory share, a time slice or a concurrent slice. A GPU is held by one
// exclusive owner, by memory shares, by time slices or by concurrent
// slices of one count, never by two of these at once.
type Share struct {
	// Mode is ShareMemory, ShareTime or ShareSlice; empty means
	// ShareMemory.
	Mode ShareMode `json:"mode,omitempty"`
	// MemoryBytes is a memory share's memory (required for one, at most
	// the GPU's memory); a time slice has none of its own. A concurrent
	// slice's is its GPU's memory divided by Slices, which the allocator
	// sets in the Allocation: a request leaves it 0, and a claim leaves it
	// 0 or gives what the allocation had.
	MemoryBytes uint64 `json:"memoryBytes,omitempty"`
	// ComputePercent, for a memory share, is the part of the GPU's
	// compute (MPS's active thread percentage, 1 to 100) its container
	// may use; 0 means no limit.
	ComputePercent int `json:"computePercent,omitempty"`
	// Slices, for a concurrent slice, is how many equal slices its GPU is
	// split into (MinSlices to MaxSlices); the other modes have none.
	Slices int `json:"slices,omitempty"`
}

// Validate checks s on its own: a mode it knows, a memory share with
// memory and a compute percentage from 0 to 100, a time slice with
// neither, a concurrent slice with a count from MinSlices to MaxSlices and
// no compute percentage of its own; only a concurrent slice has a count.
func (s Share) Validate() error {
	if s.mode() != ShareSlice && s.Slices != 0 {
		return fmt.Errorf("a %s share split in %d slices: only a concurrent slice (mode %s) has a count: %w", s.mode(), s.Slices, ShareSlice, ErrInvalidRequest)
	}
	switch s.mode() {
	case ShareMemory:
		if s.MemoryBytes == 0 {
			return fmt.Errorf("memory share of no memory: %w", ErrInvalidRequest)
		}
		if s.ComputePercent < 0 || s.ComputePercent > 100 {
			return fmt.Errorf("compute percentage %d, want 1 to 100 (0: no limit): %w", s.ComputePercent, ErrInvalidRequest)
		}
	case ShareTime:
		if s.MemoryBytes != 0 || s.ComputePercent != 0 {
			return fmt.Errorf("a time slice has no memory or compute of its own: %w", ErrInvalidRequest)
		}
	case ShareSlice:
		if s.Slices < MinSlices || s.Slices > MaxSlices {
			return fmt.Errorf("a gpu split in %d slices, want %d to %d: %w", s.Slices, MinSlices, MaxSlices, ErrInvalidRequest)
		}
		if s.ComputePercent != 0 {
			return fmt.Errorf("a concurrent slice has no compute percentage of its own (it is 1/%d of the gpu): %w", s.Slices, ErrInvalidRequest)
		}
	default:
		return fmt.Errorf("share mode %q, want %s, %s or %s: %w", s.Mode, ShareMemory, ShareTime, ShareSlice, ErrInvalidRequest)
	}
	return nil
}

func (s Share) mode() ShareMode {
	if s.Mode == "" {
		return ShareMemory
	}
	return s.Mode
}

// String describes the share: "4096 MiB", "4096 MiB, 50% compute", "time
// slice", "1 of 4 concurrent slices".
func (s Share) String() string {
	switch s.mode() {
	case ShareTime:
		return "time slice"
	case ShareSlice:
		return "1 of " + strconv.Itoa(s.Slices) + " concurrent slices"
	}
	out := FormatBytes(s.MemoryBytes)
	if s.ComputePercent > 0 {
		out += ", " + strconv.Itoa(s.ComputePercent) + "% compute"
	}
	return out
}

// FormatBytes writes a memory size in the largest binary unit that keeps it
// whole ("4 GiB", "1536 MiB", "100 B").
func FormatBytes(b uint64) string {
	for _, u := range []struct {
		shift uint
		name  string
	}{{40, "TiB"}, {30, "GiB"}, {20, "MiB"}, {10, "KiB"}} {
		if b >= 1<<u.shift && b%(1<<u.shift) == 0 {
			return strconv.FormatUint(b>>u.shift, 10) + " " + u.name
		}
	}
	return strconv.FormatUint(b, 10) + " B"
}

// WithTimeSlices sets how many time slices share one GPU at most (default
// DefaultTimeSlices).
func WithTimeSlices(n int) Option {
	return func(s *settings) error {
		if n < 1 {
			return fmt.Errorf("time slices %d per gpu: want 1 or more: %w", n, ErrInvalidRequest)
		}
		s.timeSlices = n
		return nil
	}
}

// share is r's share, if it asks for one: Request.Share, or the older
// Request.MemoryBytes, which is a memory share of that much.
func (r Request) share() (*Share, error) {
	switch {
	case r.Share == nil && r.MemoryBytes == 0:
		return nil, nil
	case r.Share == nil:
		return &Share{Mode: ShareMemory, MemoryBytes: r.MemoryBytes}, nil
	case r.MemoryBytes != 0 && (r.Share.mode() != ShareMemory || r.Share.MemoryBytes != r.MemoryBytes):
		return nil, fmt.Errorf("MemoryBytes %d beside a share of %s: %w", r.MemoryBytes, r.Share, ErrInvalidRequest)
	case r.Share.mode() == ShareSlice && r.Share.MemoryBytes != 0:
		return nil, fmt.Errorf("a concurrent slice of %d bytes: its memory is its gpu's divided by its count, not asked: %w", r.Share.MemoryBytes, ErrInvalidRequest)
	}
	s := *r.Share
	s.Mode = s.mode()
	if err := s.Validate(); err != nil {
		return nil, err
	}
	return &s, nil
}

// shareMode is the mode of the shares GPU p holds, or "" for none. The
// caller holds a.mu.
func (a *Allocator) shareMode(p int) ShareMode {
	for o := range a.shares[p] {
		if h := a.owners[o]; h != nil {
			return h.mode
		}
	}
	return ""
}

// timeSlicesOn is the number of time slices GPU p holds.
func (a *Allocator) timeSlicesOn(p int) int {
	if a.shareMode(p) != ShareTime {
		return 0
	}
	return len(a.shares[p])
}

// slicesOn is the number of concurrent slices GPU p holds, and their
// count (the N of "1 of N"), or 0, 0 for none.
func (a *Allocator) slicesOn(p int) (held, count int) {
	for o := range a.shares[p] {
		if h := a.owners[o]; h != nil && h.mode == ShareSlice {
			held, count = held+1, h.slices
		}
	}
	return held, count
}

// sliceMemory is the memory of one of n slices of GPU p.
func (a *Allocator) sliceMemory(p, n int) uint64 {
	return a.inv.Devices[p].MemoryBytes / uint64(n)
}

func (a *Allocator) timeSliceLimit() int {
	if a.cfg.timeSlices > 0 {
		return a.cfg.timeSlices
	}
	return DefaultTimeSlices
}

// fitsShare says why GPU p cannot take share s of a request matching
// match, or "" when it can; a GPU of sick may be unhealthy.
func (a *Allocator) fitsShare(p int, s Share, match, sick uint64) string {
	switch {
	case a.mig.parents&(1<<p) != 0:
		return "MIG enabled: handed out by MIG device, never shared"
	case a.shares[p] == nil:
		return "not shareable"
	case a.exclusive[p] != "":
		return "owned by " + a.exclusive[p]
	case !a.health[p].Healthy && sick&(1<<p) == 0:
		return a.health[p].String()
	case match&(1<<p) == 0:
		return "does not match the request's model or constraints"
	}
	mode := a.shareMode(p)
	if mode != "" && mode != s.mode() {
		return "held by " + string(mode) + " shares"
	}
	switch s.mode() {
	case ShareTime:
		if n := a.timeSlicesOn(p); n >= a.timeSliceLimit() {
			return fmt.Sprintf("%d of %d time slices taken", n, a.timeSliceLimit())
		}
		return ""
	case ShareSlice:
		held, count := a.slicesOn(p)
		switch {
		case held > 0 && count != s.Slices:
			return fmt.Sprintf("split in %d slices, not %d", count, s.Slices)
		case held >= s.Slices:
			return fmt.Sprintf("%d of %d slices taken", held, s.Slices)
		case a.sliceMemory(p, s.Slices) < 1<<20:
			return fmt.Sprintf("%s: too little memory for %d slices", FormatBytes(a.inv.Devices[p].MemoryBytes), s.Slices)
		}
		return ""
	}
	if free := a.freeMemory(p); free < s.MemoryBytes {
		return FormatBytes(free) + " free"
	}
	return ""
}

// placeShare chooses the GPU for share s. It packs: among the GPUs already
// holding shares of s's mode, the fullest one that has room (the least
// free memory that fits; the most time slices; the most concurrent slices
// of s's count: a GPU split in another count never takes it); only when
// none has room
// does it open a GPU no one holds, chosen by the placement policy as for a
// 1-GPU request, so that whole GPUs stay free for exclusive requests. When
// no GPU fits, a *ShareError says why for each; a share no GPU of the node
// could ever take is refused apart (see shareImpossible).
func (a *Allocator) placeShare(c compiled, s Share) (int, error) {
	if c.must == 0 {
		if err := a.shareImpossible(c, s); err != nil {
			return 0, err
		}
	}
	best := -1
	var bestKey uint64
	var open uint64
	for p := range a.n {
		if c.must != 0 && c.must&(1<<p) == 0 {
			continue
		}
		if why := a.fitsShare(p, s, c.match, c.sick); why != "" {
			if c.must != 0 {
				return 0, fmt.Errorf("%s: %s: %w", a.name(p), why, ErrDeviceUnavailable)
			}
			continue
		}
		if len(a.shares[p]) == 0 {
			open |= 1 << p
			continue
		}
		// Fuller first: less free memory, or more time slices.
		key := a.freeMemory(p)
		switch s.mode() {
		case ShareTime:
			key = uint64(a.timeSliceLimit() - a.timeSlicesOn(p))
		case ShareSlice:
			held, _ := a.slicesOn(p)
			key = uint64(s.Slices - held)
		}
		if best < 0 || key < bestKey {
			best, bestKey = p, key
		}
	}
	if best >= 0 {
		return best, nil
	}
	if open != 0 {
		return bits.TrailingZeros64(a.choose(a.cfg.policy, open, 0, 1, c.affinity, c.hasAff)), nil
	}
	e := &ShareError{Share: s}
	for p := range a.n {
		d := a.inv.Devices[p]
		f := ShareFit{Index: d.Index, UUID: d.UUID, Reason: a.fitsShare(p, s, c.match, c.sick)}
		if m := a.shareMode(p); a.shares[p] != nil && a.exclusive[p] == "" && m != ShareTime && m != ShareSlice {
			f.FreeBytes = a.freeMemory(p)
		}
		e.GPUs = append(e.GPUs, f)
	}
	return 0, e
}

// shareImpossible refuses a share that no GPU of the node could take
// whatever the others hold, so that a caller that waits for capacity
// (ErrInsufficient) is not sent to wait forever: a node with no shareable
// GPU (ErrShareNotSupported), no shareable GPU of the request's model and
// constraints, or a memory share larger than every such GPU's memory
// (ErrInvalidRequest).
func (a *Allocator) shareImpossible(c compiled, s Share) error {
	shareable := a.shareable() | a.shareCfg
	if shareable == 0 {
		return fmt.Errorf("no GPU of the node is shareable (WithShared): %w", ErrShareNotSupported)
	}
	cands := shareable & c.match
	if cands == 0 {
		return fmt.Errorf("no shareable GPU matches the request's model or constraints: %w", ErrInvalidRequest)
	}
	if s.mode() != ShareMemory {
		return nil
	}
	var largest uint64
	for _, p := range a.positions(cands) {
		largest = max(largest, a.inv.Devices[p].MemoryBytes)
	}
	if s.MemoryBytes > largest {
		return fmt.Errorf("a share of %s, more than any shareable GPU has (the most: %s): %w", FormatBytes(s.MemoryBytes), FormatBytes(largest), ErrInvalidRequest)
	}
	return nil
}

// ShareError is a share that fits on no GPU of the node: for each GPU, why.
// It is "not now": some GPU could take the share once others let go of it.
// A share no GPU could ever take is ErrShareNotSupported (no shareable
// GPU) or ErrInvalidRequest (more memory than any shareable GPU has, or no
// shareable GPU matching the request), never a ShareError.
type ShareError struct {
	// Share is what was asked for.
	Share Share
	// GPUs are the node's GPUs, in inventory order, each with its free
	// memory (of a shareable GPU not held whole, by time slices or by
	// concurrent slices) and
	// the reason it cannot take the share.
	GPUs []ShareFit
}

// ShareFit is one GPU as a ShareError sees it.
type ShareFit struct {
	Index     int    `json:"index"`
	UUID      string `json:"uuid,omitempty"`
	FreeBytes uint64 `json:"freeBytes"`
	Reason    string `json:"reason"`
}

func (e *ShareError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "no gpu has room for a share of %s", e.Share)
	if len(e.GPUs) > 0 {
		b.WriteString(" (")
		for i, g := range e.GPUs {
			if i > 0 {
				b.WriteString("; ")
			}
			fmt.Fprintf(&b, "gpu %d: %s", g.Index, g.Reason)
		}
		b.WriteString(")")
	}
	b.WriteString(": ")
	b.WriteString(ErrInsufficient.Error())
	return b.String()
}

// Is makes errors.Is(err, ErrInsufficient) hold.
func (e *ShareError) Is(target error) bool {
	return target == ErrInsufficient || target == node.ErrInsufficient
}

// ErrShareNotSupported: a share was asked of something that cannot be
// shared, such as a GPU with MIG enabled (its MIG devices can be), or of
// a node with no GPU made shareable (WithShared).
var ErrShareNotSupported = node.Sentinel(node.ErrNotSupported, "cannot be shared")

// ClaimShare makes owner hold share s of device, the GPU a container was
// started with and the share its record names: Claim of that one device
// with AsShare(s), which says what it does. HeldBy makes a holder hold it,
// as for Claim.
//
// Deprecated: call Claim(ctx, owner, []node.DeviceRef{device},
// AsShare(s)), the one claim of whole GPUs, MIG devices and shares.
func (a *Allocator) ClaimShare(ctx context.Context, owner string, device node.DeviceRef, s Share, opts ...ClaimOption) (Allocation, error) {
	return a.Claim(ctx, owner, []node.DeviceRef{device}, append(slices.Clone(opts), AsShare(s))...)
}

func (a *Allocator) claimShare(ctx context.Context, owner string, device node.DeviceRef, s Share, o claimOptions) (Allocation, error) {
	if err := ctx.Err(); err != nil {
		return Allocation{}, err
	}
	if err := node.ValidateOwner(owner); err != nil {
		return Allocation{}, err
	}
	s.Mode = s.mode()
	if err := s.Validate(); err != nil {
		return Allocation{}, err
	}
	id := strings.TrimSpace(device.UUID)
	if node.IsMIGUUID(id) {
		unlock, err := a.lock(ctx)
		if err != nil {
			return Allocation{}, err
		}
		defer unlock()
		k, ok := a.migUnitOf(id)
		if !ok {
			return Allocation{}, fmt.Errorf("MIG device %q: %w", id, ErrUnknownDevice)
		}
		return a.claimMIGShare(ctx, owner, k, s, o)
	}
	if id == "" {
		id = strconv.Itoa(device.Index)
	}
	p, err := a.resolve(id)
	if err != nil {
		return Allocation{}, err
	}
	unlock, err := a.lock(ctx)
	if err != nil {
		return Allocation{}, err
	}
	defer unlock()
	if s.Mode == ShareSlice {
		// A slice's memory is its GPU's part: a claim names it or not.
		if want := a.sliceMemory(p, s.Slices); s.MemoryBytes != 0 && s.MemoryBytes != want {
			return Allocation{}, fmt.Errorf("%s: a slice of %d is %s, not %s: %w", a.name(p), s.Slices, FormatBytes(want), FormatBytes(s.MemoryBytes), ErrInvalidRequest)
		}
		s.MemoryBytes = a.sliceMemory(p, s.Slices)
	}
	if h, ok := a.owners[owner]; ok {
		if h.shared != p || h.mode != s.Mode || h.memory != s.MemoryBytes || h.compute != s.ComputePercent || h.slices != s.Slices {
			return Allocation{}, &ClaimError{Owner: owner, Held: refNames(a.allocation(owner, h).Devices), Claimed: refNames([]node.DeviceRef{a.inv.Devices[p].Ref()})}
		}
		return a.rehold(ctx, owner, h, o.holder)
	}
	restore := a.shares[p] == nil && a.mig.parents&(1<<p) == 0
	if restore {
		a.shares[p] = map[string]uint64{}
	}
	if why := a.fitsShare(p, s, ^uint64(0), 0); why != "" {
		if restore {
			a.shares[p] = nil
		}
		return Allocation{}, fmt.Errorf("%s: %s: %w", a.name(p), why, ErrDeviceUnavailable)
	}
	h := &holding{shared: p, memory: s.MemoryBytes, mode: s.Mode, compute: s.ComputePercent, slices: s.Slices, holder: o.holder}
	if err := a.checkQuota(owner, h); err != nil {
		if restore {
			a.shares[p] = nil
		}
		return Allocation{}, err
	}
	a.apply(owner, h)
	if err := a.persist(ctx, func() {
		a.apply(owner, nil)
		if restore {
			a.shares[p] = nil
		}
	}); err != nil {
		return Allocation{}, err
	}
	if a.cfg.logger.Enabled(ctx, slog.LevelDebug) {
		a.cfg.logger.Debug("claimed a share", "owner", owner, "gpu", p, "share", s.String())
	}
	return a.allocation(owner, h), nil
}

// Shares returns the shares GPU device (index, UUID or bus id) or MIG
// device ("MIG-" UUID) holds, by owner: their allocations, sorted by
// owner.
func (a *Allocator) Shares(device string) ([]Allocation, error) {
	if a.inv == nil {
		return nil, ErrNotMade
	}
	if node.IsMIGUUID(strings.TrimSpace(device)) {
		a.mu.Lock()
		defer a.mu.Unlock()
		a.refresh()
		return a.migSharesOf(device)
	}
	p, err := a.resolve(device)
	if err != nil {
		return nil, fmt.Errorf("shares: %w", err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.refresh()
	owners := make([]string, 0, len(a.shares[p]))
	for o := range a.shares[p] {
		owners = append(owners, o)
	}
	slices.Sort(owners)
	out := make([]Allocation, 0, len(owners))
	for _, o := range owners {
		out = append(out, a.allocation(o, a.owners[o]))
	}
	return out, nil
}

// ParseBytes reads a memory size: a whole number of bytes, or one with a
// unit: K, M, G, T or KiB, MiB, GiB, TiB (binary, as docker run's
// --memory takes them), or KB, MB, GB, TB (decimal), with or without a
// space ("4GiB", "4 G", "4096M", "1073741824"). Zero, a fraction or an
// unknown unit is ErrInvalidRequest.
func ParseBytes(s string) (uint64, error) {
	t := strings.TrimSpace(s)
	i := strings.IndexFunc(t, func(r rune) bool { return r < '0' || r > '9' })
	num, unit := t, ""
	if i >= 0 {
		num, unit = t[:i], strings.TrimSpace(t[i:])
	}
	n, err := strconv.ParseUint(num, 10, 64)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("size %q: want a whole number of bytes above 0, with a unit (4GiB, 512M): %w", s, ErrInvalidRequest)
	}
	name, ok := sizeUnits[strings.ToUpper(unit)]
	if !ok {
		return 0, fmt.Errorf("size %q: unit %q, want K, M, G, T (binary: KiB...) or KB, MB, GB, TB: %w", s, unit, ErrInvalidRequest)
	}
	mult := uint64(units[name].factor) // the byte units of constraints (parseQuantity)
	if n > ^uint64(0)/mult {
		return 0, fmt.Errorf("size %q: too large: %w", s, ErrInvalidRequest)
	}
	return n * mult, nil
}

// sizeUnits are the units ParseBytes takes, in upper case, by their names
// in units: a bare K, M, G or T is binary, as docker run's --memory has it.
var sizeUnits = map[string]string{
	"": "B", "B": "B",
	"K": "KiB", "KIB": "KiB", "M": "MiB", "MIB": "MiB", "G": "GiB", "GIB": "GiB", "T": "TiB", "TIB": "TiB",
	"KB": "KB", "MB": "MB", "GB": "GB", "TB": "TB",
}
