package mps

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"time"
)

// Option configures New.
type Option func(*config) error

type config struct {
	bin         string
	driverRoot  string
	procRoot    string
	timeout     time.Duration
	lockTimeout time.Duration
	shmBytes    uint64
	pipeBytes   uint64
	plainDirs   bool
	registry    string
	// cgroupParent, cgroupRoot and cgroupNS place daemons in cgroups of
	// their own (cgroup.go).
	cgroupParent string
	cgroupRoot   string
	cgroupNS     string
	// mountNS and nsDriverRoot are WithMountNamespace's.
	mountNS      string
	nsDriverRoot string
	logger       *slog.Logger
}

// The sizes of a share's directories that its container writes: each is a
// tmpfs of its own, so that a container fills neither the disk of the
// manager's directory nor the node's memory past them.
const (
	// DefaultShmBytes bounds a share's /dev/shm (the directory its
	// container and its daemon's server share): 64 MiB, Docker's default
	// for a container's /dev/shm (WithShmSize).
	DefaultShmBytes = 64 << 20
	// DefaultPipeBytes bounds a share's pipe directory, which holds the
	// daemon's sockets, FIFOs and lock, none of which takes room: 1 MiB
	// (WithPipeSize), and at most pipeInodes files.
	DefaultPipeBytes = 1 << 20
	// pipeInodes bounds the files of a pipe directory.
	pipeInodes = 4096
	// minDirBytes is the least either directory may be given.
	minDirBytes = 64 << 10
)

// DefaultLockTimeout bounds the wait for the directory's lock, which
// another process working on the same directory holds for as long as one
// change takes (WithLockTimeout).
const DefaultLockTimeout = time.Minute

// WithControl names the MPS control daemon's binary (default: Lookup of
// the driver root).
func WithControl(path string) Option {
	return func(c *config) error {
		if !filepath.IsAbs(path) {
			return fmt.Errorf("control binary %q is not absolute: %w", path, ErrInvalid)
		}
		c.bin = path
		return nil
	}
}

// WithDriverRoot is where Lookup looks for the control binary when it is
// not in PATH (default /). A root other than / also gives each daemon the
// root's program directories on its PATH and the directories of the
// root's libcuda.so.1, as the root's ld.so.cache names them, on its
// LD_LIBRARY_PATH: a driver mounted into a container, say.
func WithDriverRoot(root string) Option {
	return func(c *config) error { c.driverRoot = root; return nil }
}

// WithProcRoot sets the proc file system processes are checked in
// (default /proc).
func WithProcRoot(dir string) Option {
	return func(c *config) error {
		if dir == "" {
			return fmt.Errorf("empty proc root: %w", ErrInvalid)
		}
		c.procRoot = dir
		return nil
	}
}

// WithStartTimeout bounds how long Start waits for a daemon to answer
// (default 10 s).
func WithStartTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("start timeout %v: %w", d, ErrInvalid)
		}
		c.timeout = d
		return nil
	}
}

// WithShmSize bounds each share's /dev/shm, a tmpfs of its own (default
// DefaultShmBytes; at least 64 KiB): a write past it fails with ENOSPC.
func WithShmSize(bytes uint64) Option {
	return func(c *config) error {
		if bytes < minDirBytes {
			return fmt.Errorf("shm size %d bytes, want at least %d: %w", bytes, minDirBytes, ErrInvalid)
		}
		c.shmBytes = bytes
		return nil
	}
}

// WithPlainDirs keeps each share's /dev/shm and pipe directory plain
// directories of the manager's directory, as releases before the bounded
// ones made them, instead of tmpfs mounts of their own. It is for a manager
// whose mounts the container runtime does not see: a program in a mount
// namespace of its own that does not propagate to the node's (a kubelet
// plugin in a pod without bidirectional mount propagation), where a
// container would bind the empty directory under the mount and never
// reach its daemon. Nothing then bounds what a share's container writes
// there but the disk of the manager's directory.
func WithPlainDirs() Option {
	return func(c *config) error {
		c.plainDirs = true
		return nil
	}
}

// WithPipeSize bounds each share's pipe directory, a tmpfs of its own
// (default DefaultPipeBytes; at least 64 KiB).
func WithPipeSize(bytes uint64) Option {
	return func(c *config) error {
		if bytes < minDirBytes {
			return fmt.Errorf("pipe directory size %d bytes, want at least %d: %w", bytes, minDirBytes, ErrInvalid)
		}
		c.pipeBytes = bytes
		return nil
	}
}

// WithLockTimeout bounds how long a change waits for the directory's lock
// (default DefaultLockTimeout); a wait past it is ErrLocked.
func WithLockTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("lock timeout %v: %w", d, ErrInvalid)
		}
		c.lockTimeout = d
		return nil
	}
}

// WithRegistry names the registry New records the manager's directory in
// (default DefaultRegistry; see Registered). It must be absolute.
func WithRegistry(dir string) Option {
	return func(c *config) error {
		if !filepath.IsAbs(dir) {
			return fmt.Errorf("registry %q is not absolute: %w", dir, ErrInvalid)
		}
		c.registry = filepath.Clean(dir)
		return nil
	}
}

// WithLogger sets where the manager reports what it does (default:
// nowhere).
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return fmt.Errorf("nil logger: %w", ErrInvalid)
		}
		c.logger = l
		return nil
	}
}
