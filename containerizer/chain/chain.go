package chain

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/isolator/cgroups"
	"github.com/gpuiso/gpuiso/isolator/mps"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/record"
	"github.com/gpuiso/gpuiso/volume"
)

// Config configures New. Allocator, Inventory and StateDir are required.
type Config struct {
	// Allocator hands out the GPUs. Give it a state directory
	// (allocator.WithStateDir) for allocations to outlive the agent.
	Allocator *allocator.Allocator
	// Inventory is the node the allocator was made for.
	Inventory *node.Inventory
	// Volumes provides the driver volume to containers with a root file
	// system of their own whose image asks for it; nil means none.
	Volumes *volume.Manager
	// StateDir holds one record per prepared container (created if
	// missing). One isolator at a time owns it: New fails with ErrInUse
	// while another holds it (until its Close), without waiting. It is
	// private to the isolator's user (made 0700, an older one tightened
	// to it): one another user owns or may write to, or whose lock file
	// another user could open, is refused (ErrUnsafeLock).
	StateDir string
	// Cgroups enforces the device rules; nil means cgroups.New(). An
	// isolator on the default parent is moved to the state directory's own
	// (see CgroupParent), so that instances never see each other's
	// cgroups.
	Cgroups *cgroups.Isolator
	// NVML reports usage (see Usage); nil means Usage is not supported.
	NVML nvml.Interface
	// MPS runs the MPS control daemons of memory shares (package
	// isolator/mps): Prepare starts a share's, Cleanup stops it, Recover
	// restarts a dead one in place and stops those no container explains.
	// Give the isolator a directory of its own (under StateDir, say). nil
	// means memory shares are refused (containerizer.ErrNoMPS).
	MPS *mps.Manager
	// Logger receives what recovery did; nil means none.
	Logger *slog.Logger
	// CPUAffinity pins every container the isolator prepares to the CPUs
	// and memory nodes local to its GPUs (containerizer.CPUAffinityNUMA;
	// the cpuset controller, beside the device rules) or not (the
	// default). On cgroup v1 a container isolated in the agent's own
	// cgroup (IsolateCgroup) cannot be pinned: the agent's cpuset is its
	// own.
	CPUAffinity containerizer.CPUAffinity
	// SysRoot is the host's sysfs, where the GPUs' NUMA nodes list their
	// CPUs (default /sys).
	SysRoot string
}

// Launch is what Prepare returns: what the agent's launch must add to its
// container for its GPUs.
type Launch struct {
	// Allocation is what the container holds; it names no device for a
	// container without GPUs.
	Allocation allocator.Allocation
	// Plan holds the device nodes the container's /dev must have (each
	// bound from its host path, or created with its numbers), the device
	// cgroup allow list, the mounts (the driver volume) and the
	// environment to set over the image's.
	Plan *isolator.Plan
}

// Isolator is a GPU isolator with the hooks of an agent's isolation chain:
// Prepare, Isolate (or IsolateCgroup), Update, Usage, Cleanup and Recover.
// It is safe for concurrent use.
type Isolator struct {
	prep   containerizer.Preparer
	alloc  *allocator.Allocator
	inv    *node.Inventory
	vols   *volume.Manager
	dir    string
	recs   *record.Store[held]
	parent string
	dev    devices
	nvml   nvml.Interface
	mps    *mps.Manager
	log    *slog.Logger
	lock   *os.File
	// affinity and opts are Config.CPUAffinity and its plan options.
	affinity containerizer.CPUAffinity
	opts     []isolator.PlanOption

	mu     sync.Mutex
	closed atomic.Bool
}

// CgroupParent is the device cgroup parent of the isolator whose state
// directory is stateDir, relative to the hierarchy's mount: under
// cgroups.DefaultParent, named by a hash of the directory's absolute path
// (containerizer.CgroupParent, "a" and "chain"), so that two agents (or
// an agent and a native containerizer) never share one.
func CgroupParent(stateDir string) string {
	return containerizer.CgroupParent("a", "chain", stateDir)
}

// New returns the isolator cfg describes, holding its state directory
// until Close. It reads nothing of the directory: call Recover before
// anything else after a restart.
func New(cfg Config) (*Isolator, error) {
	if cfg.Allocator == nil || cfg.Inventory == nil {
		return nil, fmt.Errorf("gpu isolator: no allocator or inventory: %w", node.ErrInvalid)
	}
	if cfg.StateDir == "" {
		return nil, fmt.Errorf("gpu isolator: no state directory: %w", node.ErrInvalid)
	}
	if _, err := containerizer.PlanOptions(cfg.CPUAffinity, cfg.SysRoot); err != nil {
		return nil, fmt.Errorf("gpu isolator: %w", err)
	}
	dir, err := filepath.Abs(cfg.StateDir)
	if err != nil {
		return nil, fmt.Errorf("gpu isolator: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("gpu isolator: %w", err)
	}
	cg := cfg.Cgroups
	if cg == nil {
		if cg, err = cgroups.New(); err != nil {
			return nil, fmt.Errorf("gpu isolator: %w", err)
		}
	}
	if cg.Parent() == cgroups.DefaultParent {
		if cg, err = cg.InParent(CgroupParent(dir)); err != nil {
			return nil, fmt.Errorf("gpu isolator: %w", err)
		}
	}
	lock, err := lockDir(dir)
	if err != nil {
		return nil, fmt.Errorf("gpu isolator: %w", err)
	}
	i := newIsolator(cfg, dir, cg.Parent(), cgroupDevices{base: cg})
	i.lock = lock
	return i, nil
}

// lockFile is the state directory's lock, held by the isolator that owns
// the directory.
const lockFile = ".lock"

// lockDir takes dir's lock without waiting: ErrInUse when another isolator
// holds it. dir becomes a directory no other user may list (0700; an
// older release's 0755 one is tightened) and the lock a file (0600) no
// other user can open; a directory or lock file another user owns, or may
// write to or open, is an *UnsafeLockError and is left as it is.
func lockDir(dir string) (*os.File, error) {
	f, err := openLock(dir)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(fmt.Errorf("state directory %s: %w", dir, ErrInUse))
	if err := linux.Lock(ctx, f); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// openLock opens dir's lock file, making it when missing, with the checks
// of lockDir. Where they cannot be made (other systems) the file is opened
// as it is.
func openLock(dir string) (*os.File, error) {
	err := linux.PrivateDir(dir, os.Geteuid())
	var f *os.File
	if err == nil {
		f, err = linux.OpenLockFile(dir, lockFile, os.Geteuid())
	}
	if errors.Is(err, linux.ErrNotSupported) {
		return os.OpenFile(filepath.Join(dir, lockFile), os.O_RDWR|os.O_CREATE, 0o600)
	}
	var ue *linux.UnsafeLockError
	if errors.As(err, &ue) {
		return nil, &UnsafeLockError{Path: ue.Path, Reason: ue.Reason}
	}
	if err != nil {
		return nil, fmt.Errorf("state directory lock: %w", err)
	}
	return f, nil
}

// Close gives up the state directory, for another isolator (a restarted
// agent's) to take; it leaves every container as it is. Every later call
// fails with ErrClosed.
func (i *Isolator) Close() error {
	if i == nil || i.dev == nil {
		return ErrNotMade
	}
	i.mu.Lock()
	defer i.mu.Unlock()
	i.closed.Store(true)
	if i.lock == nil {
		return nil
	}
	err := i.lock.Close()
	i.lock = nil
	return err
}

func newIsolator(cfg Config, dir, parent string, dev devices) *Isolator {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	opts, _ := containerizer.PlanOptions(cfg.CPUAffinity, cfg.SysRoot) // checked by New
	return &Isolator{
		prep:  containerizer.Preparer{Allocator: cfg.Allocator, Volumes: cfg.Volumes, SysRoot: cfg.SysRoot, MPS: cfg.MPS},
		mps:   cfg.MPS,
		alloc: cfg.Allocator, inv: cfg.Inventory, vols: cfg.Volumes,
		dir: dir, recs: records(dir), parent: parent, dev: dev, nvml: cfg.NVML, log: log,
		affinity: cfg.CPUAffinity, opts: opts,
	}
}

// Parent is the cgroup under which the isolator makes its containers'
// device cgroups, relative to the hierarchy's mount.
func (i *Isolator) Parent() string {
	if i == nil {
		return ""
	}
	return i.parent
}

func (i *Isolator) made() error {
	if i == nil || i.dev == nil {
		return ErrNotMade
	}
	if i.closed.Load() {
		return ErrClosed
	}
	return nil
}

// Prepare allocates what container id asks for (req; a request for
// nothing holds nothing and gets every GPU denied) and returns what its
// launch must add: device nodes, rules, mounts and environment. img is
// what the agent knows of the container's image (its environment, with
// the container's own settings over it, and labels carry the NVIDIA_*
// requirements). Nothing is enforced yet: the agent then calls Isolate
// with the container's first process before it runs the command, or
// IsolateCgroup with a cgroup it made. On error nothing is held.
func (i *Isolator) Prepare(ctx context.Context, id string, req allocator.Request, img containerizer.Image) (l *Launch, err error) {
	if err := i.made(); err != nil {
		return nil, err
	}
	if err := node.ValidateOwner(id); err != nil {
		return nil, fmt.Errorf("prepare %s: %w", id, err)
	}
	i.mu.Lock()
	defer i.mu.Unlock()
	if _, err := i.read(id); !errors.Is(err, ErrUnknownContainer) {
		if err == nil {
			err = ErrContainerExists
		}
		return nil, fmt.Errorf("prepare %s: %w", id, err)
	}
	// The record comes first: a crash from here on leaves what Prepare
	// took findable by Recover.
	if err := i.write(held{ID: id, Phase: phasePreparing}); err != nil {
		return nil, fmt.Errorf("prepare %s: %w", id, err)
	}
	defer func() {
		if err != nil {
			i.remove(id)
		}
	}()
	p, err := i.prep.Prepare(ctx, containerizer.Spec{ID: id, GPUs: req, CPUAffinity: i.affinity}, img)
	if err != nil {
		return nil, fmt.Errorf("prepare %s: %w", id, err)
	}
	rec := held{ID: id, Phase: phasePrepared, GPUs: uuids(p.Allocation.Devices), Share: p.Allocation.Share}
	if p.Volume != nil {
		rec.Volume = p.Volume.Version
	}
	if err := i.write(rec); err != nil {
		p.Undo(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("prepare %s: %w", id, err)
	}
	return &Launch{Allocation: p.Allocation, Plan: p.Plan}, nil
}

// Isolate enforces container id's device rules on its process pid: the
// isolator makes the container's device cgroup (under Parent) with its
// rules and moves pid into it. The agent calls it before pid runs the
// container's command; its children inherit the cgroup. On cgroup2, where a
// process is in one cgroup only, this takes pid out of the agent's own
// cgroups: an agent with a CPU or memory cgroup there uses IsolateCgroup.
func (i *Isolator) Isolate(ctx context.Context, id string, pid int) error {
	if err := i.made(); err != nil {
		return err
	}
	if pid <= 0 {
		return fmt.Errorf("isolate %s: pid %d: %w", id, pid, node.ErrInvalid)
	}
	i.mu.Lock()
	defer i.mu.Unlock()
	rec, err := i.prepared(id)
	if err != nil {
		return fmt.Errorf("isolate %s: %w", id, err)
	}
	plan, err := i.plan(id)
	if err != nil {
		return fmt.Errorf("isolate %s: %w", id, err)
	}
	parent, name := i.target(rec)
	if err := i.enforce(ctx, parent, name, plan, rec.Cgroup != ""); err != nil {
		return fmt.Errorf("isolate %s: %w", id, err)
	}
	if err := i.dev.AddProcess(ctx, parent, name, pid); err != nil {
		return fmt.Errorf("isolate %s: %w", id, err)
	}
	return nil
}

// IsolateCgroup enforces container id's device rules on a cgroup the agent
// made for it (cgroup, relative to the device hierarchy's mount: the v1
// devices controller's or the cgroup2 file system's; on cgroup2 the agent's
// CPU and memory cgroup itself). The cgroup stays the agent's: Cleanup
// leaves it, and refuses while it still holds processes.
func (i *Isolator) IsolateCgroup(ctx context.Context, id, cgroup string) error {
	if err := i.made(); err != nil {
		return err
	}
	if err := validCgroup(cgroup); err != nil {
		return fmt.Errorf("isolate %s in cgroup %q: %w", id, cgroup, err)
	}
	i.mu.Lock()
	defer i.mu.Unlock()
	rec, err := i.prepared(id)
	if err != nil {
		return fmt.Errorf("isolate %s: %w", id, err)
	}
	plan, err := i.plan(id)
	if err != nil {
		return fmt.Errorf("isolate %s: %w", id, err)
	}
	if rec.Cgroup != cgroup {
		rec.Cgroup = cgroup
		if err := i.write(rec); err != nil {
			return fmt.Errorf("isolate %s: %w", id, err)
		}
	}
	parent, name := i.target(rec)
	if err := i.enforce(ctx, parent, name, plan, true); err != nil {
		return fmt.Errorf("isolate %s in cgroup %s: %w", id, cgroup, err)
	}
	return nil
}

// cpuSetter is what the isolator needs to pin a cgroup to CPUs and memory
// nodes; the cgroups back end has it.
type cpuSetter interface {
	SetCPUs(ctx context.Context, parent, name, cpus, mems string) error
	Version() cgroups.Version
}

// enforce applies plan's device rules to the cgroup parent/name and, when
// the plan pins its container, its CPUs and memory nodes. agents says the
// cgroup is the agent's own (IsolateCgroup), which v1 cannot pin.
func (i *Isolator) enforce(ctx context.Context, parent, name string, plan *isolator.Plan, agents bool) error {
	if err := i.dev.Apply(ctx, parent, name, plan.Rules); err != nil {
		return err
	}
	if plan.CPUs == "" && plan.Mems == "" {
		return nil
	}
	cs, ok := i.dev.(cpuSetter)
	if !ok || (agents && cs.Version() == cgroups.V1) {
		return fmt.Errorf("pin cgroup %s/%s to CPUs %s: %w", parent, name, plan.CPUs, containerizer.ErrNotSupported)
	}
	return cs.SetCPUs(ctx, parent, name, plan.CPUs, plan.Mems)
}

func validCgroup(cgroup string) error {
	clean := filepath.Clean("/" + cgroup)[1:]
	if cgroup == "" || clean != cgroup || !strings.Contains(cgroup, "/") {
		return fmt.Errorf("%w: want a clean relative path with a parent", ErrInvalidCgroup)
	}
	if err := node.ValidateOwner(filepath.Base(cgroup)); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidCgroup, err)
	}
	return nil
}

// target is where rec's rules are enforced: the agent's cgroup, or the
// isolator's own.
func (i *Isolator) target(rec held) (parent, name string) {
	if rec.Cgroup != "" {
		return filepath.Dir(rec.Cgroup), filepath.Base(rec.Cgroup)
	}
	return i.parent, rec.ID
}

// prepared returns id's record, which Prepare must have completed.
func (i *Isolator) prepared(id string) (held, error) {
	if err := node.ValidateOwner(id); err != nil {
		return held{}, err
	}
	rec, err := i.read(id)
	if err != nil {
		return held{}, err
	}
	if rec.Phase != phasePrepared {
		return held{}, ErrUnknownContainer
	}
	return rec, nil
}

// allocation is what id holds; the empty allocation when it holds nothing.
func (i *Isolator) allocation(id string) (allocator.Allocation, error) {
	al, err := i.alloc.Allocation(id)
	if errors.Is(err, allocator.ErrUnknownOwner) {
		return allocator.Allocation{Owner: id}, nil
	}
	return al, err
}

// plan is id's plan, derived from what it holds: its device rules and,
// with Config.CPUAffinity, its CPUs.
func (i *Isolator) plan(id string) (*isolator.Plan, error) {
	al, err := i.allocation(id)
	if err != nil {
		return nil, err
	}
	return i.planFor(id, al.Devices)
}

func (i *Isolator) planFor(id string, gpus []node.DeviceRef) (*isolator.Plan, error) {
	return isolator.NewPlan(id, i.inv, gpus, nil, nil, i.opts...)
}

// rulesFor is the device allow list of id holding gpus.
func (i *Isolator) rulesFor(id string, gpus []node.DeviceRef) ([]isolator.Rule, error) {
	plan, err := i.planFor(id, gpus)
	if err != nil {
		return nil, err
	}
	return plan.Rules, nil
}

// Update changes the number of whole GPUs container id holds, live, in
// the order of containerizer.Resize. A shrink first denies the GPUs that
// go, then frees them, then records that; a grow takes the new GPUs,
// records them, then allows them: no GPU is ever reachable from two
// containers, and an agent killed at any step leaves a container that
// Recover holds and enforces as the allocator has it (the record follows).
// It returns what the container holds afterwards.
func (i *Isolator) Update(ctx context.Context, id string, gpus int) (allocator.Allocation, error) {
	if err := i.made(); err != nil {
		return allocator.Allocation{}, err
	}
	if gpus < 0 {
		return allocator.Allocation{}, fmt.Errorf("update %s to %d gpus: %w", id, gpus, allocator.ErrInvalidRequest)
	}
	i.mu.Lock()
	defer i.mu.Unlock()
	al, err := i.update(ctx, id, gpus)
	if err != nil {
		return allocator.Allocation{}, fmt.Errorf("update %s to %d gpus: %w", id, gpus, err)
	}
	return al, nil
}

func (i *Isolator) update(ctx context.Context, id string, gpus int) (allocator.Allocation, error) {
	rec, err := i.prepared(id)
	if err != nil {
		return allocator.Allocation{}, err
	}
	parent, name := i.target(rec)
	step := containerizer.Resize{Allocator: i.alloc, Owner: id, Logger: i.log,
		Enforce: func(ctx context.Context, gpus []node.DeviceRef) error {
			plan, err := i.planFor(id, gpus)
			if err != nil {
				return err
			}
			return i.enforce(ctx, parent, name, plan, rec.Cgroup != "")
		},
		Commit: func(al allocator.Allocation) error {
			rec.GPUs = uuids(al.Devices)
			return i.write(rec)
		},
	}
	return step.To(ctx, gpus)
}

// Usage reports what container id's processes use of its GPUs, as NVML
// tells. Without NVML (Config.NVML) it fails with an error matching
// node.ErrNotSupported.
func (i *Isolator) Usage(ctx context.Context, id string) (nvmlnode.Usage, error) {
	if err := i.made(); err != nil {
		return nvmlnode.Usage{}, err
	}
	i.mu.Lock()
	rec, err := i.prepared(id)
	var al allocator.Allocation
	if err == nil {
		al, err = i.allocation(id)
	}
	i.mu.Unlock()
	if err != nil {
		return nvmlnode.Usage{}, fmt.Errorf("usage of %s: %w", id, err)
	}
	if i.nvml == nil {
		return nvmlnode.Usage{}, fmt.Errorf("usage of %s: no NVML: %w", id, node.ErrNotSupported)
	}
	parent, name := i.target(rec)
	pids, err := i.dev.Processes(ctx, parent, name)
	if err != nil {
		return nvmlnode.Usage{}, fmt.Errorf("usage of %s: %w", id, err)
	}
	if ret := i.nvml.Init(); ret != nvml.SUCCESS {
		return nvmlnode.Usage{}, fmt.Errorf("usage of %s: %w", id, &nvmlnode.NVMLError{Op: "init", Device: -1, Return: ret})
	}
	defer i.nvml.Shutdown()
	u, err := nvmlnode.ReadUsage(ctx, i.nvml, al.Devices, pids)
	if err != nil {
		return u, fmt.Errorf("usage of %s: %w", id, err)
	}
	return u, nil
}

// Cleanup gives back everything the isolator holds for container id: its
// own device cgroup (whose processes are killed), the allocation, the
// driver volume use and the record; then the parent, once empty. It is
// idempotent: a container already cleaned up, or never prepared, is not
// an error. A container isolated in the agent's cgroup must be gone
// first: while that cgroup holds processes Cleanup fails with
// ErrStillRunning and changes nothing.
func (i *Isolator) Cleanup(ctx context.Context, id string) error {
	if err := i.made(); err != nil {
		return err
	}
	if err := node.ValidateOwner(id); err != nil {
		return fmt.Errorf("clean up %s: %w", id, err)
	}
	i.mu.Lock()
	defer i.mu.Unlock()
	if err := i.cleanup(ctx, id); err != nil {
		return fmt.Errorf("clean up %s: %w", id, err)
	}
	return nil
}

func (i *Isolator) cleanup(ctx context.Context, id string) error {
	rec, err := i.read(id)
	known := err == nil
	corrupt := errors.Is(err, ErrCorruptRecord)
	if err != nil && !corrupt && !errors.Is(err, ErrUnknownContainer) {
		return err
	}
	if known && rec.Cgroup != "" {
		parent, name := i.target(rec)
		pids, err := i.dev.Processes(ctx, parent, name)
		if err != nil && !errors.Is(err, isolator.ErrUnknownContainer) {
			return err
		}
		if len(pids) > 0 {
			return fmt.Errorf("%w: %d in cgroup %s", ErrStillRunning, len(pids), rec.Cgroup)
		}
	}
	// The isolator's own cgroup first: once its processes are gone, its
	// GPUs are free to go.
	if err := i.dev.Destroy(ctx, i.parent, id); err != nil {
		return err
	}
	if !known && !corrupt {
		i.dev.RemoveParent(i.parent)
		return nil
	}
	// A memory share's daemon before its share: while it runs, the share
	// stays held.
	if i.mps != nil {
		if err := i.mps.Stop(ctx, id); err != nil {
			return err
		}
	}
	var errs []error
	if err := i.alloc.Release(ctx, id); err != nil && !errors.Is(err, allocator.ErrUnknownOwner) {
		errs = append(errs, err)
	}
	errs = append(errs, i.releaseVolume(ctx, id, rec))
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if err := i.remove(id); err != nil {
		return err
	}
	i.dev.RemoveParent(i.parent)
	return nil
}

// releaseVolume gives back id's driver volume use: the one its record
// names, or, for a record Prepare did not complete (or one that cannot be
// read), any volume that lists id as a user.
func (i *Isolator) releaseVolume(ctx context.Context, id string, rec held) error {
	if rec.Phase == phasePrepared && rec.Volume == "" {
		return nil
	}
	version := ""
	if rec.Phase == phasePrepared {
		version = rec.Volume
	}
	return containerizer.ReleaseVolume(ctx, i.vols, id, version)
}

func uuids(refs []node.DeviceRef) []string {
	out := make([]string, 0, len(refs))
	for _, r := range refs {
		out = append(out, r.UUID)
	}
	return out
}
