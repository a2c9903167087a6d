package allocator

import (
	"fmt"
	"io"
	"log/slog"
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

// holding is what one owner holds: whole GPUs, a share of one GPU, or MIG
// devices.
type holding struct {
	group   string
	holder  *Holder   // what proves the owner alive, or nil
	devices uint64    // exclusive GPUs by position
	shared  int       // position of the shared GPU, or -1
	memory  uint64    // bytes on the shared GPU (a memory share)
	mode    ShareMode // the share's mode, when shared >= 0
	compute int       // a memory share's compute percentage, or 0
	slices  int       // a concurrent slice's count (1 of slices), or 0
	mig     []int     // MIG devices by unit number, ascending
	// sharedMIG is the unit number + 1 of the MIG device a share holds
	// (mode, memory, compute, slices as for a GPU's), or 0 for none.
	sharedMIG int
}

// Option configures New.
type Option func(*settings) error

type settings struct {
	stateDir  string
	policy    Policy
	quotas    map[string]int
	shareable []string
	// timeSlices is the most time slices on one GPU (0: the default).
	timeSlices int
	logger     *slog.Logger
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

// WithShared makes the named GPUs (index, UUID or bus id) shareable:
// requests with a Share (or MemoryBytes) get part of one of them, a memory
// share or a time slice. A shareable GPU is held by one exclusive owner, by
// memory shares or by time slices, never by two of these at once;
// whole-GPU requests take shareable GPUs only when the others do not
// suffice, and shares pack onto GPUs already shared before they open one.
// A GPU with MIG enabled cannot be made shareable.
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
		if opt == nil {
			return nil, fmt.Errorf("new allocator: nil option: %w", node.ErrInvalid)
		}
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
