package cgroups

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/node"
)

// DefaultCpusetMount is where hosts mount cgroup v1's cpuset hierarchy.
const DefaultCpusetMount = "/sys/fs/cgroup/cpuset"

// WithCpusetMount sets the mount point of cgroup v1's cpuset hierarchy,
// which SetCPUs uses beside the devices controller (default
// DefaultCpusetMount). cgroup2 has cpuset in its one hierarchy.
func WithCpusetMount(dir string) Option {
	return func(i *Isolator) error {
		if !filepath.IsAbs(dir) {
			return fmt.Errorf("cpuset mount %q: must be absolute", dir)
		}
		i.cpusetMount = filepath.Clean(dir)
		return nil
	}
}

// cpusetPath is owner's cgroup in the v1 cpuset hierarchy.
func (i *Isolator) cpusetPath(owner string) string {
	return filepath.Join(i.cpuset(), i.parent, owner)
}

func (i *Isolator) cpuset() string {
	if i.cpusetMount == "" {
		return DefaultCpusetMount
	}
	return i.cpusetMount
}

// SetCPUs pins owner's container to cpus and memory nodes mems (the
// kernel's list format, "0-3,8"; both required), and checks that the
// kernel took them (the effective lists read back).
//
// On cgroup2 they are the cpuset.cpus and cpuset.mems of the container's
// cgroup (made if needed, as Apply makes it), with the cpuset controller
// enabled from the hierarchy's root down to the parent. A hierarchy where
// cpuset cannot be enabled (a hybrid host's cgroup2, whose controllers are
// all v1's) gives an error matching isolator.ErrNotSupported.
//
// On v1 the container gets a cgroup of the same name in the cpuset
// hierarchy (see WithCpusetMount), made with its parents, each given its
// own parent's CPUs and memory nodes (v1 refuses processes in a cpuset
// without them). AddProcess then moves a process into it too, and Destroy
// and RemoveParent remove it with the device cgroup.
func (i *Isolator) SetCPUs(ctx context.Context, owner, cpus, mems string) error {
	if i.mount == "" {
		return ErrNotMade
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := node.ValidateOwner(owner); err != nil {
		return err
	}
	want := map[string]string{"cpus": cpus, "mems": mems}
	for _, k := range []string{"cpus", "mems"} {
		l, err := isolator.ParseList(want[k])
		if err != nil || len(l) == 0 {
			return fmt.Errorf("pin %s: %s %q: %w", owner, k, want[k], node.ErrInvalid)
		}
		want[k] = isolator.FormatList(l)
	}
	var dir string
	var err error
	if i.version == V1 {
		dir, err = i.cpusetV1(owner)
	} else {
		dir, err = i.cpusetV2(owner)
	}
	if err == nil {
		err = writeCpuset(dir, i.version, want["cpus"], want["mems"])
	}
	if err != nil {
		return fmt.Errorf("pin %s to CPUs %s, memory nodes %s (cgroup %s): %w", owner, cpus, mems, i.version, err)
	}
	return nil
}

// writeCpuset writes a cpuset's lists (memory nodes first: a v1 cpuset
// needs both before it takes a process) and reads back the effective ones
// (v1's cpuset.effective_cpus, cgroup2's cpuset.cpus.effective).
func writeCpuset(dir string, v Version, cpus, mems string) error {
	for _, kv := range [][2]string{{"mems", mems}, {"cpus", cpus}} {
		if err := write(dir, "cpuset."+kv[0], kv[1]); err != nil {
			return err
		}
		effective := "cpuset." + kv[0] + ".effective"
		if v == V1 {
			effective = "cpuset.effective_" + kv[0]
		}
		got, err := readList(filepath.Join(dir, effective))
		if err != nil {
			return err
		}
		if got != kv[1] {
			return fmt.Errorf("%s is %q after writing %q: %w", effective, got, kv[1], ErrVerify)
		}
	}
	return nil
}

// readList reads a list file of a cpuset, normalised.
func readList(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	l, err := isolator.ParseList(strings.TrimSpace(string(b)))
	if err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	return isolator.FormatList(l), nil
}

// cpusetV2 enables cpuset from the root down to owner's parent and returns
// owner's cgroup, made if needed.
func (i *Isolator) cpusetV2(owner string) (string, error) {
	dir := i.mount
	for _, p := range strings.Split(i.parent, "/") {
		if err := enableController(dir, "cpuset"); err != nil {
			return "", err
		}
		dir = filepath.Join(dir, p)
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return "", err
		}
	}
	if err := enableController(dir, "cpuset"); err != nil {
		return "", err
	}
	dir = filepath.Join(dir, owner)
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", err
	}
	return dir, nil
}

// enableController enables ctl for dir's children (cgroup.subtree_control)
// unless it is already.
func enableController(dir, ctl string) error {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.subtree_control"))
	if err != nil {
		return err
	}
	if slices.Contains(strings.Fields(string(b)), ctl) {
		return nil
	}
	avail, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	if err != nil {
		return err
	}
	if !slices.Contains(strings.Fields(string(avail)), ctl) {
		return fmt.Errorf("%s: no %s controller in %s/cgroup.controllers (%q): %w", dir, ctl, dir, strings.TrimSpace(string(avail)), isolator.ErrNotSupported)
	}
	if err := write(dir, "cgroup.subtree_control", "+"+ctl); err != nil {
		return fmt.Errorf("enable %s in %s: %w", ctl, dir, err)
	}
	return nil
}

// cpusetV1 makes owner's cgroup in the cpuset hierarchy and its parents,
// each parent given its own parent's lists where it has none, and returns
// owner's.
func (i *Isolator) cpusetV1(owner string) (string, error) {
	root := i.cpuset()
	magic, err := linux.FilesystemType(root)
	if err != nil || magic != linux.CgroupMagic {
		return "", fmt.Errorf("no cgroup v1 cpuset hierarchy at %s: %w", root, isolator.ErrNotSupported)
	}
	if _, err := os.Stat(filepath.Join(root, "cpuset.cpus")); err != nil {
		return "", fmt.Errorf("%s is not the cpuset hierarchy: %w: %w", root, isolator.ErrNotSupported, err)
	}
	dir := root
	for _, p := range strings.Split(i.parent, "/") {
		up := dir
		dir = filepath.Join(dir, p)
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return "", err
		}
		for _, f := range []string{"cpuset.mems", "cpuset.cpus"} {
			have, err := os.ReadFile(filepath.Join(dir, f))
			if err != nil {
				return "", err
			}
			if strings.TrimSpace(string(have)) != "" {
				continue
			}
			from, err := os.ReadFile(filepath.Join(up, f))
			if err != nil {
				return "", err
			}
			if err := write(dir, f, strings.TrimSpace(string(from))); err != nil {
				return "", fmt.Errorf("%s/%s: %w", dir, f, err)
			}
		}
	}
	dir = filepath.Join(dir, owner)
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", err
	}
	return dir, nil
}

// addToCpusetV1 moves pid into owner's v1 cpuset cgroup, if SetCPUs made
// one.
func (i *Isolator) addToCpusetV1(owner string, pid int) error {
	dir := i.cpusetPath(owner)
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err := write(dir, "cgroup.procs", strconv.Itoa(pid)); err != nil {
		return fmt.Errorf("add process %d to the cpuset of %s: %w", pid, owner, err)
	}
	return nil
}

// removeCpusetV1 removes owner's v1 cpuset cgroup, once its processes
// (killed with the device cgroup's) are gone.
func (i *Isolator) removeCpusetV1(ctx context.Context, owner string) error {
	if i.version != V1 {
		return nil
	}
	return removeDir(ctx, i.cpusetPath(owner))
}

// removeDir removes an emptied cgroup, waiting while it stays busy for the
// moment exits take.
func removeDir(ctx context.Context, dir string) error {
	for {
		err := os.Remove(dir)
		if err == nil || errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if !linux.Busy(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("remove %s: %w", dir, ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
}
