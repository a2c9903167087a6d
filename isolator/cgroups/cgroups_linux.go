package cgroups

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/cgroups/v3"

	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/node"
)

// Version is a cgroup version.
type Version int

// Versions.
const (
	V1 Version = 1 // the cgroup v1 devices controller
	V2 Version = 2 // a cgroup2 eBPF device program
)

func (v Version) String() string { return "v" + strconv.Itoa(int(v)) }

// Defaults.
const (
	DefaultParent  = "gpuiso"
	DefaultV1Mount = "/sys/fs/cgroup/devices"
)

// Option configures New.
type Option func(*Isolator) error

// WithVersion chooses the cgroup version instead of the host's default.
func WithVersion(v Version) Option {
	return func(i *Isolator) error {
		if v != V1 && v != V2 {
			return fmt.Errorf("cgroup version %d: want 1 or 2", v)
		}
		i.version = v
		return nil
	}
}

// WithParent sets the cgroup under which containers' cgroups are made
// (default "gpuiso"); it may be nested ("agent/gpuiso").
func WithParent(parent string) Option {
	return func(i *Isolator) error {
		clean := filepath.Clean("/" + parent)[1:]
		if parent == "" || clean != parent || strings.HasPrefix(parent, "..") {
			return fmt.Errorf("cgroup parent %q: want a clean relative path", parent)
		}
		i.parent = parent
		return nil
	}
}

// WithMount sets the mount point of the hierarchy used: the v1 devices
// controller's, or the cgroup2 file system's.
func WithMount(dir string) Option {
	return func(i *Isolator) error {
		if !filepath.IsAbs(dir) {
			return fmt.Errorf("cgroup mount %q: must be absolute", dir)
		}
		i.mount = filepath.Clean(dir)
		return nil
	}
}

// Isolator applies device rules to containers' cgroups. It keeps no state of
// its own beyond its configuration: the kernel holds the rules.
type Isolator struct {
	version Version
	parent  string
	mount   string
	// cpusetMount is v1's cpuset hierarchy (SetCPUs); "" is the default.
	cpusetMount string
}

// New returns an isolator for this host.
func New(opts ...Option) (*Isolator, error) {
	i := &Isolator{parent: DefaultParent}
	for _, opt := range opts {
		if opt == nil {
			return nil, fmt.Errorf("cgroups isolator: nil option: %w", node.ErrInvalid)
		}
		if err := opt(i); err != nil {
			return nil, fmt.Errorf("cgroups isolator: %w", err)
		}
	}
	mode := cgroups.Mode()
	if i.version == 0 {
		switch mode {
		case cgroups.Unified:
			i.version = V2
		case cgroups.Legacy, cgroups.Hybrid:
			i.version = V1
		default:
			return nil, fmt.Errorf("cgroups isolator: no cgroup hierarchy: %w", isolator.ErrNotSupported)
		}
	}
	if i.mount == "" {
		switch {
		case i.version == V1:
			i.mount = DefaultV1Mount
		case mode == cgroups.Unified:
			i.mount = "/sys/fs/cgroup"
		default:
			i.mount = "/sys/fs/cgroup/unified"
		}
	}
	if err := i.check(); err != nil {
		return nil, fmt.Errorf("cgroups isolator %s at %s: %w", i.version, i.mount, err)
	}
	return i, nil
}

// check verifies the hierarchy is there.
func (i *Isolator) check() error {
	probe := "devices.allow"
	if i.version == V2 {
		probe = "cgroup.procs"
	}
	if _, err := os.Stat(filepath.Join(i.mount, probe)); err != nil {
		return fmt.Errorf("%w: %w", isolator.ErrNotSupported, err)
	}
	return nil
}

// Version is the cgroup version in use.
func (i *Isolator) Version() Version { return i.version }

// Parent is the cgroup under which containers' cgroups are made, relative
// to the hierarchy's mount.
func (i *Isolator) Parent() string { return i.parent }

// InParent returns an isolator like i whose containers' cgroups are made
// under parent instead; parent is checked as WithParent checks it.
func (i *Isolator) InParent(parent string) (*Isolator, error) {
	if i.mount == "" {
		return nil, ErrNotMade
	}
	out := *i
	if err := WithParent(parent)(&out); err != nil {
		return nil, fmt.Errorf("cgroups isolator: %w", err)
	}
	return &out, nil
}

// RemoveParent removes the parent cgroup once no container's cgroup (or
// any other) is left in it. A parent that still has children, or is
// already gone, stays as it is without error.
func (i *Isolator) RemoveParent() error {
	if i.mount == "" {
		return ErrNotMade
	}
	dirs := []string{filepath.Join(i.mount, i.parent)}
	if i.version == V1 {
		dirs = append(dirs, filepath.Join(i.cpuset(), i.parent))
	}
	for _, dir := range dirs {
		err := os.Remove(dir)
		if err == nil || errors.Is(err, fs.ErrNotExist) || linux.Busy(err) || linux.NotEmpty(err) {
			continue
		}
		return fmt.Errorf("remove cgroup parent %s: %w", i.parent, err)
	}
	return nil
}

// Path is the cgroup directory of owner's container.
func (i *Isolator) Path(owner string) string { return filepath.Join(i.mount, i.parent, owner) }

// Apply makes owner's cgroup allow exactly rules (allow rules; everything
// else is denied), creating the cgroup if needed. On a live cgroup it
// changes only what differs and never denies a device that stays allowed.
func (i *Isolator) Apply(ctx context.Context, owner string, rules []isolator.Rule) error {
	if i.mount == "" {
		return ErrNotMade
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := node.ValidateOwner(owner); err != nil {
		return err
	}
	for _, r := range rules {
		if err := r.Validate(); err != nil {
			return fmt.Errorf("apply device rules to %s: %w", owner, err)
		}
		if !r.Allow {
			return fmt.Errorf("apply device rules to %s: %w: %s is a deny rule; give the allow list", owner, isolator.ErrInvalidRule, r)
		}
	}
	want := isolator.Canonical(rules)
	var err error
	if i.version == V1 {
		err = i.applyV1(owner, want)
	} else {
		err = i.applyV2(owner, want)
	}
	if err != nil {
		return fmt.Errorf("apply device rules to %s (cgroup %s): %w", owner, i.version, err)
	}
	return nil
}

// Rules reads the allow rules in force for owner from the kernel.
func (i *Isolator) Rules(ctx context.Context, owner string) ([]isolator.Rule, error) {
	if i.mount == "" {
		return nil, ErrNotMade
	}
	if err := node.ValidateOwner(owner); err != nil {
		return nil, err
	}
	if _, err := os.Stat(i.Path(owner)); errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("device rules of %s: %w", owner, isolator.ErrUnknownContainer)
	}
	if i.version == V1 {
		return i.rulesV1(owner)
	}
	return i.rulesV2(owner)
}

// AddProcess moves pid into owner's cgroup.
func (i *Isolator) AddProcess(ctx context.Context, owner string, pid int) error {
	if i.mount == "" {
		return ErrNotMade
	}
	if err := node.ValidateOwner(owner); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(i.Path(owner), "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("add process %d to %s: %w", pid, owner, isolator.ErrUnknownContainer)
		}
		return fmt.Errorf("add process %d to %s: %w", pid, owner, err)
	}
	if i.version == V1 {
		return i.addToCpusetV1(owner, pid)
	}
	return nil
}

// Processes lists the processes in owner's cgroup.
func (i *Isolator) Processes(ctx context.Context, owner string) ([]int, error) {
	if i.mount == "" {
		return nil, ErrNotMade
	}
	if err := node.ValidateOwner(owner); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(filepath.Join(i.Path(owner), "cgroup.procs"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("processes of %s: %w", owner, isolator.ErrUnknownContainer)
	}
	if err != nil {
		return nil, fmt.Errorf("processes of %s: %w", owner, err)
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("processes of %s: cgroup.procs holds %q", owner, f)
		}
		pids = append(pids, pid)
	}
	return pids, nil
}

// Destroy kills every process of owner's cgroup (forks included: SIGKILL
// until the cgroup is empty) and removes the cgroup. A cgroup that is
// already gone is not an error.
func (i *Isolator) Destroy(ctx context.Context, owner string) error {
	if i.mount == "" {
		return ErrNotMade
	}
	if err := node.ValidateOwner(owner); err != nil {
		return err
	}
	dir := i.Path(owner)
	for {
		pids, err := i.Processes(ctx, owner)
		if errors.Is(err, isolator.ErrUnknownContainer) {
			// A v1 cpuset cgroup left behind holds none of the
			// container's processes: each joined the device cgroup
			// first.
			if err := i.removeCpusetV1(ctx, owner); err != nil {
				return fmt.Errorf("destroy %s: %w", owner, err)
			}
			return nil
		}
		if err != nil {
			return fmt.Errorf("destroy %s: %w", owner, err)
		}
		if len(pids) == 0 {
			break
		}
		for _, pid := range pids {
			if err := linux.Kill(pid); err != nil {
				return fmt.Errorf("destroy %s: kill %d: %w", owner, pid, err)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("destroy %s: %w", owner, ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
	// An emptied cgroup can stay busy for a moment while exits finish.
	if err := removeDir(ctx, dir); err != nil {
		return fmt.Errorf("destroy %s: %w", owner, err)
	}
	if err := i.removeCpusetV1(ctx, owner); err != nil {
		return fmt.Errorf("destroy %s: %w", owner, err)
	}
	return nil
}

// Owners lists the containers whose cgroups exist: what recovery after a
// restart starts from. Only the parent's direct children are listed, and
// not those that hold cgroups of their own: such a child is the parent of
// someone else's containers (a nested parent), never a container's cgroup.
func (i *Isolator) Owners(ctx context.Context) ([]string, error) {
	if i.mount == "" {
		return nil, ErrNotMade
	}
	entries, err := os.ReadDir(filepath.Join(i.mount, i.parent))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list containers: %w", err)
	}
	var owners []string
	for _, e := range entries {
		if e.IsDir() && node.ValidateOwner(e.Name()) == nil && !hasChildren(filepath.Join(i.mount, i.parent, e.Name())) {
			owners = append(owners, e.Name())
		}
	}
	return owners, nil
}

// hasChildren tells whether the cgroup dir holds cgroups of its own; one
// that cannot be read counts as holding some, so that it is left alone.
func hasChildren(dir string) bool {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return !errors.Is(err, fs.ErrNotExist)
	}
	for _, e := range entries {
		if e.IsDir() {
			return true
		}
	}
	return false
}
