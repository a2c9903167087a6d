package mps

import (
	"fmt"
	"path"
	"path/filepath"

	"github.com/gpuiso/gpuiso/internal/linux"
)

// CgroupDir is the cgroup, under the parent WithCgroup names, whose
// children hold the daemons: <parent>/gpuiso-mps/<owner>.
const CgroupDir = "gpuiso-mps"

// DefaultCgroupRoot is where the host mounts its cgroup hierarchies.
const DefaultCgroupRoot = "/sys/fs/cgroup"

// WithCgroup places each daemon, right after it starts, in a cgroup of its
// own, <parent>/gpuiso-mps/<owner> (parent is a cgroup path as the host
// names it, "/" for the root), made in every hierarchy mounted at the
// cgroup root (WithCgroupRoot): the unified one and, on a hybrid host,
// every v1 hierarchy. The daemon and the servers it starts then live
// outside the cgroup of the program that started them, so that whatever
// ends that program's cgroup (a container runtime that kills every
// process of a container's cgroup when the container's init ends, an OOM
// kill of it, its memory limit) leaves them running; they are charged to
// that cgroup's parents instead. The cgroup is removed when the daemon
// stops. The daemon's record names it, so that any manager of the
// directory, with this option or without, removes it. Without the option
// a daemon stays in its starter's cgroup.
func WithCgroup(parent string) Option {
	return func(c *config) error {
		if err := linux.CheckCgroupPath(parent); err != nil {
			return fmt.Errorf("cgroup parent: %w: %w", err, ErrInvalid)
		}
		c.cgroupParent = parent
		return nil
	}
}

// WithCgroupRoot sets where the host's cgroup hierarchies are mounted, in
// the manager's mount namespace (default DefaultCgroupRoot): a container
// whose own /sys/fs/cgroup shows its cgroup alone mounts the host's
// elsewhere.
func WithCgroupRoot(dir string) Option {
	return func(c *config) error {
		if !filepath.IsAbs(dir) {
			return fmt.Errorf("cgroup root %q is not absolute: %w", dir, ErrInvalid)
		}
		c.cgroupRoot = filepath.Clean(dir)
		return nil
	}
}

// WithCgroupNamespace names the cgroup namespace a daemon is moved from
// (/proc/1/ns/cgroup in a container that shares the host's pid
// namespace): cgroup v2 mounted with nsdelegate (as systemd mounts it)
// moves a process only between cgroups the mover's namespace reaches, and
// a container's namespace of its own reaches only its own cgroup. The move is made from a thread that joined it (default:
// the manager's own namespace, which is the host's outside a container).
func WithCgroupNamespace(nsFile string) Option {
	return func(c *config) error {
		if !filepath.IsAbs(nsFile) {
			return fmt.Errorf("cgroup namespace %q is not absolute: %w", nsFile, ErrInvalid)
		}
		c.cgroupNS = nsFile
		return nil
	}
}

// cgroupOf is the cgroup of owner's daemon, or "" without WithCgroup.
func (m *Manager) cgroupOf(owner string) string {
	if m.cgroupParent == "" {
		return ""
	}
	return path.Join(m.cgroupParent, CgroupDir, owner)
}

// hierarchies are the cgroup hierarchies under the manager's cgroup root.
func (m *Manager) hierarchies() ([]linux.CgroupHierarchy, error) {
	root := m.cgroupRoot
	if root == "" {
		root = DefaultCgroupRoot
	}
	return linux.CgroupHierarchies(root)
}

// CheckCgroupParent checks a parent for WithCgroup on its own: an absolute,
// clean cgroup path (no "..", no empty or "." component), which cannot
// leave the hierarchy it is joined to. A bad one matches ErrInvalid.
func CheckCgroupParent(parent string) error {
	if err := linux.CheckCgroupPath(parent); err != nil {
		return fmt.Errorf("cgroup parent: %w: %w", err, ErrInvalid)
	}
	return nil
}

// OwnCgroups is the calling process's cgroup in each hierarchy, keyed by
// the hierarchy's controllers as /proc/<pid>/cgroup lists them ("" for
// the unified hierarchy, "memory", "name=systemd", ...), each path as the
// cgroup namespace nsFile shows it ("": the caller's own; a container that
// shares the host's pid namespace names the host's, /proc/1/ns/cgroup):
// where a starter finds the parent for WithCgroup, such as the one of its
// kubepods cgroup.
func OwnCgroups(nsFile string) (map[string]string, error) {
	return linux.OwnCgroups(nsFile)
}
