package allocator

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/bits"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/gpuiso/gpuiso/node"
)

// MaxDevices is the most GPUs an Allocator manages.
const MaxDevices = 64

// MaxAffinities is the most affinities a request may carry.
const MaxAffinities = 32

// Allocator is the single truth of which owner (a container) holds which
// GPU of a node. It is safe for concurrent use. Every change is all or
// nothing, and with a state directory it is on disk before the call returns.
type Allocator struct {
	inv    *node.Inventory
	n      int
	pair   []int64 // n*n link scores
	maxLnk int64
	all    uint64 // mask of every position
	sw     []int  // by position: lowest position behind the same PCIe switch
	numa   []int  // by position: dense NUMA group number
	groups int    // number of NUMA groups
	cfg    settings

	mu        sync.Mutex
	owners    map[string]*holding
	exclusive []string            // by device: the exclusive owner, or ""
	shares    []map[string]uint64 // by device: shared owner -> bytes
	health    []node.Health
	store     *store
	warnings  []string
	mig       migTable
	shareCfg  uint64 // GPUs configured shareable (WithShared)
}

// holding is what one owner holds: whole GPUs, or memory on one GPU.
type holding struct {
	group   string
	holder  *Holder // what proves the owner alive, or nil
	devices uint64  // exclusive GPUs by position
	shared  int     // position of the shared GPU, or -1
	memory  uint64  // bytes on the shared GPU
	mig     []int   // MIG devices by unit number, ascending
}

// Option configures New.
type Option func(*settings) error

type settings struct {
	stateDir  string
	policy    Policy
	quotas    map[string]int
	shareable []string
	logger    *slog.Logger
	// migManager creates MIG devices on demand (WithMIGManager), or nil.
	migManager MIGManager
	procRoot   string
}

// WithStateDir makes the allocator durable: its state lives in a file in
// dir, every change is written (atomically, checksummed) before the call
// that makes it returns, and New loads what is there.
func WithStateDir(dir string) Option {
	return func(s *settings) error {
		if dir == "" {
			return fmt.Errorf("empty state directory: %w", ErrInvalidRequest)
		}
		s.stateDir = dir
		return nil
	}
}

// WithPolicy sets the placement policy (default PolicyTopology).
func WithPolicy(p Policy) Option {
	return func(s *settings) error {
		if !p.valid() {
			return fmt.Errorf("policy %q: want topology, pack or spread", p)
		}
		s.policy = p
		return nil
	}
}

// WithQuota limits the GPUs that the owners of group may hold together. A
// GPU counts once for a group however many of the group's shares it holds.
func WithQuota(group string, gpus int) Option {
	return func(s *settings) error {
		if group == "" || gpus < 0 {
			return fmt.Errorf("quota %q: %d: want a group name and a limit >= 0", group, gpus)
		}
		s.quotas[group] = gpus
		return nil
	}
}

// WithShared makes the named GPUs (index, UUID or bus id) shareable by
// memory: requests with MemoryBytes get a slice of one of them. A shareable
// GPU is held either by shares or by one exclusive owner, never both;
// whole-GPU requests take shareable GPUs only when the others do not
// suffice.
func WithShared(devices ...string) Option {
	return func(s *settings) error {
		s.shareable = append(s.shareable, devices...)
		return nil
	}
}

// WithLogger sets where the allocator reports what it does (default:
// nowhere).
func WithLogger(l *slog.Logger) Option {
	return func(s *settings) error {
		if l == nil {
			return fmt.Errorf("nil logger: %w", ErrInvalidRequest)
		}
		s.logger = l
		return nil
	}
}

// New returns an allocator for the GPUs of inv. Devices unhealthy in inv
// are never handed out until marked healthy. With WithStateDir it loads the
// saved state; a state file that cannot be trusted fails New with a
// *StateError, never a silent reset.
func New(inv *node.Inventory, opts ...Option) (*Allocator, error) {
	s := settings{policy: PolicyTopology, quotas: map[string]int{}, logger: slog.New(slog.NewTextHandler(io.Discard, nil)), procRoot: node.DefaultProcRoot}
	for _, opt := range opts {
		if err := opt(&s); err != nil {
			return nil, fmt.Errorf("new allocator: %w", err)
		}
	}
	if inv == nil {
		return nil, fmt.Errorf("new allocator: nil inventory: %w", ErrInvalidRequest)
	}
	n := len(inv.Devices)
	if n > MaxDevices {
		return nil, fmt.Errorf("new allocator: %d GPUs, at most %d: %w", n, MaxDevices, node.ErrNotSupported)
	}
	if inv.Topology.Len() != n {
		return nil, fmt.Errorf("new allocator: topology of %d GPUs for %d devices: %w", inv.Topology.Len(), n, node.ErrInvalidTopology)
	}
	a := &Allocator{
		inv:       inv.Clone(),
		n:         n,
		pair:      make([]int64, n*n),
		cfg:       s,
		owners:    map[string]*holding{},
		exclusive: make([]string, n),
		shares:    make([]map[string]uint64, n),
		health:    make([]node.Health, n),
	}
	for i := range n {
		a.health[i] = a.inv.Devices[i].Health
		for j := range n {
			sc := int64(inv.Topology.Score(i, j))
			a.pair[i*n+j] = sc
			a.maxLnk = max(a.maxLnk, sc)
		}
	}
	if n > 0 {
		a.all = ^uint64(0) >> (64 - n)
	}
	a.sw = a.switchOf()
	a.numa = make([]int, n)
	ids := map[int]int{}
	for p, d := range a.inv.Devices {
		g, ok := ids[d.NUMANode]
		if !ok {
			g = len(ids)
			ids[d.NUMANode] = g
		}
		a.numa[p] = g
	}
	a.groups = len(ids)
	for _, ref := range s.shareable {
		i, err := a.resolve(ref)
		if err != nil {
			return nil, fmt.Errorf("new allocator: shared device: %w", err)
		}
		if a.shareCfg&(1<<i) != 0 {
			return nil, fmt.Errorf("new allocator: shared device %q: %w", ref, ErrDuplicateDevice)
		}
		if a.shares[i] == nil {
			a.shares[i] = map[string]uint64{}
		}
		a.shareCfg |= 1 << i
	}
	if err := a.initMIG(); err != nil {
		return nil, fmt.Errorf("new allocator: %w", err)
	}
	if s.stateDir != "" {
		st, err := openStore(s.stateDir, s.procRoot)
		if err != nil {
			return nil, fmt.Errorf("new allocator: %w", err)
		}
		a.store = st
		if err := a.open(); err != nil {
			st.close()
			return nil, fmt.Errorf("new allocator: %w", err)
		}
	}
	return a, nil
}

// Policy is how the allocator chooses GPUs for a count.
type Policy string

// Policies.
const (
	// PolicyTopology (the default) chooses the set with the highest link
	// score (NVLink 100 per link, PCIe 10 to 60 by level), exactly for nodes
	// of up to 16 GPUs. A 1-GPU request takes the GPU whose departure costs
	// the others least, so NVLink pairs stay whole.
	PolicyTopology Policy = "topology"
	// PolicyPack fills a NUMA node, and within it a PCIe switch, before the
	// next (best fit), which leaves large blocks free.
	PolicyPack Policy = "pack"
	// PolicySpread takes GPUs from the NUMA nodes with the most free GPUs
	// in turn.
	PolicySpread Policy = "spread"
)

// Policies lists the placement policies.
func Policies() []Policy { return []Policy{PolicyTopology, PolicyPack, PolicySpread} }

func (p Policy) valid() bool { return p == PolicyTopology || p == PolicyPack || p == PolicySpread }

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
	// (see WithShared) instead of whole GPUs. Count must then be 0 or 1.
	MemoryBytes uint64 `json:"memoryBytes,omitempty"`
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
}

// Allocation is what an owner holds.
type Allocation struct {
	Owner string `json:"owner"`
	Group string `json:"group,omitempty"`
	// Devices are the GPUs, in inventory order; for MIG devices each is
	// its parent's identity with the device's "MIG-" UUID and a MIG part
	// (instance ids and capability nodes).
	Devices []node.DeviceRef `json:"devices"`
	// Shared tells whether this is a slice of one GPU's memory.
	Shared bool `json:"shared,omitempty"`
	// MemoryBytes is the memory of a shared allocation.
	MemoryBytes uint64 `json:"memoryBytes,omitempty"`
	// Holder is the request's Holder, if it had one.
	Holder *Holder `json:"holder,omitempty"`
	// Env is what the container's environment should carry:
	// NVIDIA_VISIBLE_DEVICES and, for a shared GPU, the MPS memory limit
	// CUDA_MPS_PINNED_DEVICE_MEM_LIMIT.
	Env map[string]string `json:"env,omitempty"`
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
	memory   uint64
	holder   *Holder
}

func (a *Allocator) compile(r Request) (compiled, error) {
	c := compiled{group: r.Group, memory: r.MemoryBytes}
	if r.Holder != nil {
		if err := r.Holder.validate(); err != nil {
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
	c.count = r.Count
	if c.count == 0 {
		c.count = len(r.Devices)
	}
	switch {
	case r.MemoryBytes > 0 && c.count > 1:
		return c, fmt.Errorf("shared request for %d GPUs, want one: %w", c.count, ErrInvalidRequest)
	case r.MemoryBytes > 0:
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
	for _, k := range r.Constraints {
		if err := k.Validate(); err != nil {
			return c, fmt.Errorf("%w: %w", ErrInvalidRequest, err)
		}
		if err := a.knownAttribute(k); err != nil {
			return c, err
		}
	}
	if len(r.Affinities) > MaxAffinities {
		return c, fmt.Errorf("%d affinities, at most %d: %w", len(r.Affinities), MaxAffinities, ErrInvalidRequest)
	}
	for _, k := range r.Affinities {
		if err := k.Validate(); err != nil {
			return c, fmt.Errorf("%w: %w", ErrInvalidRequest, err)
		}
		if err := a.knownAttribute(k.Constraint); err != nil {
			return c, err
		}
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
		for _, k := range r.Constraints {
			ok = ok && k.Matches(d)
		}
		if ok {
			c.match |= 1 << p
		}
		for _, k := range r.Affinities {
			if k.Matches(d) {
				c.affinity[p] += int64(k.Weight)
				c.hasAff = true
			}
		}
	}
	return c, nil
}

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

func describe(r Request) string {
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
	if r.MemoryBytes > 0 {
		return fmt.Sprintf("%d bytes of gpu memory", r.MemoryBytes)
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

func (a *Allocator) allocate(ctx context.Context, owner string, r Request) (Allocation, error) {
	if err := ctx.Err(); err != nil {
		return Allocation{}, err
	}
	if err := node.ValidateOwner(owner); err != nil {
		return Allocation{}, err
	}
	if isMIGRequest(r) {
		return a.allocateMIG(ctx, owner, r)
	}
	c, err := a.compile(r)
	if err != nil {
		return Allocation{}, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	unlock, err := a.lockState(ctx)
	if err != nil {
		return Allocation{}, err
	}
	defer unlock()
	if _, ok := a.owners[owner]; ok {
		return Allocation{}, ErrOwnerExists
	}
	h := &holding{group: c.group, shared: -1, holder: c.holder}
	if c.memory > 0 {
		p, err := a.placeShared(c)
		if err != nil {
			return Allocation{}, err
		}
		h.shared, h.memory = p, c.memory
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
		a.cfg.logger.Debug("allocated", "owner", owner, "devices", a.positions(h.devices), "shared", h.shared, "memory", h.memory)
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
	free := a.usable() & c.match
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

// placeShared chooses the shareable GPU for a memory request: the one with
// the least free memory that fits (best fit), then the lowest position.
func (a *Allocator) placeShared(c compiled) (int, error) {
	best, bestFree := -1, uint64(0)
	mostFree := uint64(0)
	for p := range a.n {
		if a.shares[p] == nil || a.exclusive[p] != "" || !a.health[p].Healthy || c.match&(1<<p) == 0 {
			if c.must&(1<<p) != 0 {
				if a.shares[p] == nil {
					return 0, fmt.Errorf("%s: not shareable: %w", a.name(p), ErrDeviceUnavailable)
				}
				return 0, fmt.Errorf("%s: %s: %w", a.name(p), a.why(p, c), ErrDeviceUnavailable)
			}
			continue
		}
		if c.must != 0 && c.must&(1<<p) == 0 {
			continue
		}
		free := a.freeMemory(p)
		mostFree = max(mostFree, free)
		if free >= c.memory && (best < 0 || free < bestFree) {
			best, bestFree = p, free
		}
	}
	if best < 0 {
		return 0, &InsufficientError{Requested: clampInt(c.memory), Free: clampInt(mostFree)}
	}
	return best, nil
}

func clampInt(v uint64) int {
	if v > uint64(int(^uint(0)>>1)) {
		return int(^uint(0) >> 1)
	}
	return int(v)
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
		m |= h.devices | a.migParentsOf(h.mig)
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
	want := h.devices | a.migParentsOf(h.mig)
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

func (a *Allocator) allocation(owner string, h *holding) Allocation {
	al := Allocation{Owner: owner, Group: h.group}
	if h.holder != nil {
		hh := *h.holder
		al.Holder = &hh
	}
	if len(h.mig) > 0 {
		al.Devices = a.migRefs(h.mig)
	} else if h.shared >= 0 {
		al.Shared, al.MemoryBytes = true, h.memory
		al.Devices = []node.DeviceRef{a.inv.Devices[h.shared].Ref()}
	} else {
		al.Devices = make([]node.DeviceRef, 0, bits.OnesCount64(h.devices))
		for m := h.devices; m != 0; m &= m - 1 {
			al.Devices = append(al.Devices, a.inv.Devices[bits.TrailingZeros64(m)].Ref())
		}
	}
	var visible strings.Builder
	for i, d := range al.Devices {
		if i > 0 {
			visible.WriteByte(',')
		}
		if d.UUID != "" {
			visible.WriteString(d.UUID)
		} else {
			visible.WriteString(strconv.Itoa(d.Index))
		}
	}
	al.Env = map[string]string{"NVIDIA_VISIBLE_DEVICES": visible.String()}
	if al.Shared {
		mib := max(h.memory>>20, 1)
		al.Env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = "0=" + strconv.FormatUint(mib, 10) + "M"
	}
	return al
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
	a.mu.Lock()
	defer a.mu.Unlock()
	unlock, err := a.lockState(ctx)
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
	a.mu.Lock()
	defer a.mu.Unlock()
	unlock, err := a.lockState(ctx)
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
		k, ok := a.migUnitOf(device)
		if !ok {
			return nil, fmt.Errorf("owners: MIG device %q: %w", device, ErrUnknownDevice)
		}
		if o := a.mig.owner[k]; o != "" {
			return []string{o}, nil
		}
		return []string{}, nil
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

// checkInvariants verifies the allocator's internal consistency: every GPU
// held once, per-device views agreeing with per-owner ones, shares within
// memory and never beside an exclusive owner.
func (a *Allocator) checkInvariants() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	var seen uint64
	for o, h := range a.owners {
		if h.devices&seen != 0 {
			return fmt.Errorf("owner %s: device held twice", o)
		}
		seen |= h.devices
		for _, p := range a.positions(h.devices) {
			if a.exclusive[p] != o {
				return fmt.Errorf("owner %s holds %s but the device says %q", o, a.name(p), a.exclusive[p])
			}
		}
		if h.shared >= 0 {
			if h.devices != 0 {
				return fmt.Errorf("owner %s holds both shares and whole GPUs", o)
			}
			if a.shares[h.shared][o] != h.memory {
				return fmt.Errorf("owner %s share mismatch", o)
			}
		} else if h.devices == 0 && len(h.mig) == 0 {
			return fmt.Errorf("owner %s holds nothing", o)
		}
	}
	for p := range a.n {
		if a.exclusive[p] != "" {
			if h := a.owners[a.exclusive[p]]; h == nil || h.devices&(1<<p) == 0 {
				return fmt.Errorf("%s owned by unknown %s", a.name(p), a.exclusive[p])
			}
			if len(a.shares[p]) > 0 {
				return fmt.Errorf("%s both exclusive and shared", a.name(p))
			}
		}
		var used uint64
		for o, m := range a.shares[p] {
			if h := a.owners[o]; h == nil || h.shared != p {
				return fmt.Errorf("%s shared by unknown %s", a.name(p), o)
			}
			used += m
		}
		if used > a.inv.Devices[p].MemoryBytes {
			return fmt.Errorf("%s shares %d bytes of %d", a.name(p), used, a.inv.Devices[p].MemoryBytes)
		}
	}
	return a.checkMIGInvariants()
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
