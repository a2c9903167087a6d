package native

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/isolator/cgroups"
	"github.com/gpuiso/gpuiso/isolator/mps"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/volume"
)

// Config is what a Containerizer (New) or a Runtime (NewRuntime) works
// with. Isolator is required, and Allocator for New; zero values of the
// rest mean their defaults.
type Config struct {
	// Allocator hands out the GPUs (New). A Runtime takes none: the
	// containerizer.Lifecycle it runs under has the one allocator.
	Allocator *allocator.Allocator
	// Inventory is the node the allocator was made for (default: the
	// Allocator's; required by NewRuntime).
	Inventory *node.Inventory
	// Isolator confines each container to its devices: a
	// *cgroups.Isolator, in practice. One on the package default parent
	// (cgroups.DefaultParent, what cgroups.New() gives) is moved to the
	// state directory's own parent, CgroupParent(StateDir), so that
	// containerizers on distinct state directories never share a cgroup
	// parent. Only in its own parent does Recover remove cgroups no record
	// explains, and the parent itself once its last container is gone.
	Isolator Isolator
	// Volumes provides the driver volume (New); nil means containers get
	// none. A Runtime takes none: its Lifecycle's manager provides it.
	Volumes *volume.Manager
	// MPS runs the MPS control daemons of memory shares (package
	// isolator/mps; New); nil means memory shares are refused. A Runtime
	// takes none: its Lifecycle's manager runs them, and the runtime hides
	// their directory from every container (containerizer.Prepared.MPSDir).
	MPS *mps.Manager
	// MPSRegistry is where the node's MPS managers record their
	// directories, whatever program made them (default
	// mps.DefaultRegistry; see mps.Registered). A container that keeps the
	// host's file system has every directory recorded there masked, with
	// gpuiso's default state directories (GPUISOStateDirs): no other
	// program's daemon is within its reach either.
	MPSRegistry string
	// NVML reports the containers' GPU usage (see Usage); nil means usage
	// is not supported.
	NVML nvml.Interface
	// ProcRoot is the proc file system (default /proc).
	ProcRoot string
	// SysRoot is the host's sysfs, where a container pinned to its GPUs'
	// NUMA nodes (Spec.CPUAffinity) finds their CPUs (default /sys).
	SysRoot string
	// StateDir holds the containers' state (default DefaultStateDir).
	StateDir string
	// InitPath is the binary started as each container's init; it must call
	// Init first thing (default: this process's own binary).
	InitPath string
	// Logger receives what the containerizer does (default: nothing).
	Logger *slog.Logger
}

// Isolator is what the containerizer needs of a device isolator; package
// isolator/cgroups provides it for the v1 devices controller and the cgroup
// v2 eBPF filter.
type Isolator interface {
	// Version is the cgroup version the isolator works with.
	Version() cgroups.Version
	// Apply makes id's cgroup allow exactly rules (creating the cgroup).
	Apply(ctx context.Context, id string, rules []isolator.Rule) error
	// AddProcess moves pid into id's cgroup.
	AddProcess(ctx context.Context, id string, pid int) error
	// OpenCgroup opens id's cgroup directory, for a child to be born in it
	// (cgroup v2 only).
	OpenCgroup(id string) (*os.File, error)
	// Processes lists the pids in id's cgroup.
	Processes(ctx context.Context, id string) ([]int, error)
	// Owners lists the ids that have a cgroup.
	Owners(ctx context.Context) ([]string, error)
	// Destroy kills id's processes and removes its cgroup; a missing one
	// is not an error.
	Destroy(ctx context.Context, id string) error
}

// devices is what the containerizer does to a container's private /dev;
// the default is the host's file system (see dev.go).
type devices interface {
	makeDev(dir string, nodes []isolator.DeviceNode) error
	addNode(dir string, n isolator.DeviceNode) error
	removeNode(dir string, n isolator.DeviceNode) error
	removeDev(dir string) error
}

// hostDevices makes real device nodes.
type hostDevices struct{}

func (hostDevices) makeDev(dir string, nodes []isolator.DeviceNode) error { return makeDev(dir, nodes) }
func (hostDevices) addNode(dir string, n isolator.DeviceNode) error       { return addNode(dir, n) }
func (hostDevices) removeNode(dir string, n isolator.DeviceNode) error    { return removeNode(dir, n) }
func (hostDevices) removeDev(dir string) error                            { return removeDev(dir) }

// New returns a containerizer: a containerizer.Lifecycle over one native
// Runtime of cfg, with cfg.Allocator, cfg.Volumes and cfg.MPS. Call
// Recover (an agent) or Clean (a program that runs its containers only
// while it lives) before launching containers when the state directory may
// hold containers of an earlier process. For native containers beside
// others (Docker ones) under one Lifecycle and one allocator, give
// NewRuntime's Runtime to containerizer.NewLifecycle with the others.
func New(cfg Config) (*Containerizer, error) {
	if cfg.Allocator == nil || cfg.Isolator == nil {
		return nil, fmt.Errorf("native containerizer: Allocator and Isolator are required: %w", node.ErrInvalid)
	}
	if cfg.Inventory == nil {
		cfg.Inventory = cfg.Allocator.Inventory()
	}
	alloc, vols, daemons := cfg.Allocator, cfg.Volumes, cfg.MPS
	cfg.Allocator, cfg.Volumes, cfg.MPS = nil, nil, nil
	rt, err := NewRuntime(cfg)
	if err != nil {
		return nil, err
	}
	lc, err := containerizer.NewLifecycle(containerizer.LifecycleConfig{
		Runtime: rt, Allocator: alloc, Volumes: vols, MPS: daemons, SysRoot: cfg.SysRoot, Logger: cfg.Logger,
	})
	if err != nil {
		return nil, fmt.Errorf("native containerizer: %w", err)
	}
	return &Containerizer{Lifecycle: lc, rt: rt.runner}, nil
}

// Runtime is the native containerizer.Runtime: it reserves each
// container's directory in the state directory, makes its private /dev,
// its cgroup and its init, lists the containers from their records, takes
// over those of dead supervisors, sweeps its leftovers and resizes a
// running container's GPUs (containerizer's Reserver, Adopter, Cleaner and
// Updater). This process supervises its containers (Supervised). A
// containerizer.Lifecycle decides the rest.
type Runtime struct {
	*runner
}

var _ containerizer.Maker = (*Runtime)(nil)

// Made tells whether r was made by NewRuntime (containerizer.Maker).
func (r *Runtime) Made() bool { return r != nil && r.runner != nil }

// NewRuntime returns the native runtime of cfg, for a
// containerizer.Lifecycle alone (what New builds) or beside other runtimes
// over one allocator. cfg.Isolator and cfg.Inventory are required;
// cfg.Allocator, cfg.Volumes and cfg.MPS must be nil: they are the
// Lifecycle's.
func NewRuntime(cfg Config) (*Runtime, error) {
	switch {
	case cfg.Isolator == nil || cfg.Inventory == nil:
		return nil, fmt.Errorf("native runtime: Isolator and Inventory are required: %w", node.ErrInvalid)
	case cfg.Allocator != nil || cfg.Volumes != nil || cfg.MPS != nil:
		return nil, fmt.Errorf("native runtime: an Allocator, Volumes or MPS: give them to the Lifecycle: %w", node.ErrInvalid)
	}
	if cfg.ProcRoot == "" {
		cfg.ProcRoot = node.DefaultProcRoot
	}
	if cfg.StateDir == "" {
		cfg.StateDir = DefaultStateDir
	}
	if cfg.InitPath == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("native runtime: own binary for the init: %w", err)
		}
		cfg.InitPath = exe
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	for _, p := range []string{cfg.ProcRoot, cfg.StateDir, cfg.InitPath} {
		if !filepath.IsAbs(p) {
			return nil, fmt.Errorf("native runtime: %q must be an absolute path: %w", p, node.ErrInvalid)
		}
	}
	own := CgroupParent(cfg.StateDir)
	if iso, ok := cfg.Isolator.(*cgroups.Isolator); ok && iso.Parent() == cgroups.DefaultParent {
		moved, err := iso.InParent(own)
		if err != nil {
			return nil, fmt.Errorf("native runtime: %w", err)
		}
		cfg.Isolator = moved
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("native runtime: %w", err)
	}
	rt := &runner{cfg: cfg, dev: hostDevices{}, self: self(cfg.ProcRoot)}
	if p, ok := cfg.Isolator.(parented); ok && p.Parent() == own {
		rt.parent = p
	}
	return &Runtime{runner: rt}, nil
}

// Isolator is the isolator the runtime works with: Config.Isolator, or the
// same on the state directory's own cgroup parent when Config.Isolator was
// on the package default.
func (r *Runtime) Isolator() Isolator {
	if r == nil || r.runner == nil {
		return nil
	}
	return r.cfg.Isolator
}

// parented is what an isolator tells of its cgroup parent;
// *cgroups.Isolator has it.
type parented interface {
	Parent() string
	RemoveParent() error
}

// The runtime finds parented by a type assertion, which a changed
// signature would fail quietly.
var _ parented = (*cgroups.Isolator)(nil)

// Isolator is the isolator the containerizer works with: Config.Isolator,
// or the same on the state directory's own cgroup parent when
// Config.Isolator was on the package default.
func (c *Containerizer) Isolator() Isolator {
	if c == nil || c.rt == nil {
		return nil
	}
	return c.rt.cfg.Isolator
}
