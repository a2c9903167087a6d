package mps

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/node"
)

// Manager starts, stops and recovers the MPS control daemons of the shares
// whose state lives in one directory. Any number of managers, in one
// process or many, may work on one directory: each change takes the
// directory's lock. It is safe for concurrent use.
type Manager struct {
	dir         string
	bin         string
	procRoot    string
	timeout     time.Duration
	lockTimeout time.Duration
	shmBytes    uint64
	pipeBytes   uint64
	plainDirs   bool
	log         *slog.Logger

	// cgroupParent, cgroupRoot and cgroupNS are WithCgroup's,
	// WithCgroupRoot's and WithCgroupNamespace's.
	cgroupParent, cgroupRoot, cgroupNS string
	// driverRoot is WithDriverRoot's; mountNS and nsDriverRoot
	// WithMountNamespace's.
	driverRoot, mountNS, nsDriverRoot string

	// sem, with the lock file, lets one change at a time work on the
	// directory: a channel rather than a mutex, so that every wait for it
	// has a deadline.
	sem  chan struct{}
	lock *os.File

	// startFn starts a daemon's process (linux.StartDaemon when nil).
	startFn func(*exec.Cmd, []linux.NamespaceMount) error
	// hostRoot is where serverSource looks for the server last, as the
	// daemons' PATH does ("/" when empty).
	hostRoot string
}

// New returns a manager of the daemons under dir (made if missing, and
// made root's alone: mode 0700, its lock file 0600; one of another user is
// ErrInvalid). It fails with ErrNoControl when the node has no control
// binary, or the one WithControl names is not an executable file. It
// records dir in the registry (WithRegistry, DefaultRegistry) that
// container runtimes read to hide every manager's daemons from their
// containers (Registered); a process that is not root records nothing
// (it cannot start a daemon either).
func New(dir string, opts ...Option) (*Manager, error) {
	c := config{procRoot: node.DefaultProcRoot, timeout: 10 * time.Second, lockTimeout: DefaultLockTimeout,
		shmBytes: DefaultShmBytes, pipeBytes: DefaultPipeBytes, registry: DefaultRegistry, cgroupRoot: DefaultCgroupRoot,
		logger: slog.New(slog.DiscardHandler)}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("mps manager: nil option: %w", node.ErrInvalid)
		}
		if err := o(&c); err != nil {
			return nil, fmt.Errorf("mps manager: %w", err)
		}
	}
	if c.bin == "" {
		bin, err := Lookup(c.driverRoot)
		if err != nil {
			return nil, fmt.Errorf("mps manager: %w", err)
		}
		c.bin = bin
	} else if fi, err := os.Stat(c.bin); err != nil || !fi.Mode().IsRegular() || fi.Mode()&0o111 == 0 {
		return nil, fmt.Errorf("mps manager: control binary %s is not an executable file: %w", c.bin, ErrNoControl)
	}
	abs, err := filepath.Abs(dir)
	if err != nil || dir == "" {
		return nil, fmt.Errorf("mps manager: directory %q: %w", dir, ErrInvalid)
	}
	if err := os.MkdirAll(abs, 0o700); err != nil {
		return nil, fmt.Errorf("mps manager: %w", err)
	}
	if err := ownDir(abs); err != nil {
		return nil, fmt.Errorf("mps manager: %w", err)
	}
	f, err := openLock(abs)
	if err != nil {
		return nil, fmt.Errorf("mps manager: %w", err)
	}
	if linux.IsRoot() {
		if err := register(c.registry, abs); err != nil {
			f.Close()
			return nil, fmt.Errorf("mps manager: register %s in %s: %w", abs, c.registry, err)
		}
	}
	return &Manager{dir: abs, bin: c.bin, procRoot: c.procRoot, timeout: c.timeout, lockTimeout: c.lockTimeout,
		shmBytes: c.shmBytes, pipeBytes: c.pipeBytes, plainDirs: c.plainDirs, log: c.logger, sem: make(chan struct{}, 1), lock: f,
		cgroupParent: c.cgroupParent, cgroupRoot: c.cgroupRoot, cgroupNS: c.cgroupNS, driverRoot: c.driverRoot,
		mountNS: c.mountNS, nsDriverRoot: c.nsDriverRoot}, nil
}

// ownDir makes dir, a directory of the calling user, its alone (0700),
// not following a link. One that another user owns, or that group or
// others may write to (and so may have planted a lock file in), is
// ErrInvalid and left as it is; then no one else can make or replace an
// entry of it.
func ownDir(dir string) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory (%v): %w", dir, fi.Mode().Type(), ErrInvalid)
	}
	if uid, ok := linux.Owner(fi); ok && int(uid) != os.Geteuid() {
		return fmt.Errorf("%s belongs to uid %d, not to this process's %d: %w", dir, uid, os.Geteuid(), ErrInvalid)
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("%s may be written by others (%v): %w", dir, fi.Mode().Perm(), ErrInvalid)
	}
	if fi.Mode().Perm() != 0o700 {
		return os.Chmod(dir, 0o700)
	}
	return nil
}

// openLock opens the lock file of dir (ownDir's), made 0600 when missing.
// Anything but a regular file of the calling user's that no one else may
// open is ErrInvalid: a lock file others could open may be open in a
// stranger's process, holding its lock whatever its mode becomes.
func openLock(dir string) (*os.File, error) {
	path := filepath.Join(dir, lockFile)
	if fi, err := os.Lstat(path); err == nil && !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("lock %s is a %v, not a file: %w", path, fi.Mode().Type(), ErrInvalid)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	switch {
	case err != nil:
	case !fi.Mode().IsRegular():
		err = fmt.Errorf("lock %s is not a regular file: %w", path, ErrInvalid)
	case fi.Mode().Perm()&0o077 != 0:
		err = fmt.Errorf("lock %s may be opened by others (%v): %w", path, fi.Mode().Perm(), ErrInvalid)
	default:
		if uid, ok := linux.Owner(fi); ok && int(uid) != os.Geteuid() {
			err = fmt.Errorf("lock %s belongs to uid %d: %w", path, uid, ErrInvalid)
		}
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// Dir is the manager's directory.
func (m *Manager) Dir() string {
	if m == nil {
		return ""
	}
	return m.dir
}

// Control is the control binary the manager runs.
func (m *Manager) Control() string {
	if m == nil {
		return ""
	}
	return m.bin
}

// Close lets go of the directory's lock file; the daemons run on. It waits
// for a change in progress at most the lock timeout (ErrLocked).
func (m *Manager) Close() error {
	if m == nil || m.sem == nil {
		return nil
	}
	if err := m.acquire(context.Background()); err != nil {
		return fmt.Errorf("close the MPS manager of %s: %w", m.dir, err)
	}
	defer m.release()
	if m.lock == nil {
		return nil
	}
	err := m.lock.Close()
	m.lock = nil
	return err
}

func (m *Manager) made() error {
	if m == nil || m.dir == "" || m.sem == nil {
		return ErrNotMade
	}
	return nil
}

// acquire takes the in-process turn, waiting at most the lock timeout.
func (m *Manager) acquire(ctx context.Context) error {
	t := time.NewTimer(m.lockTimeout)
	defer t.Stop()
	select {
	case m.sem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait for another change of %s: %w", m.dir, context.Cause(ctx))
	case <-t.C:
		return fmt.Errorf("another change of %s took over %v: %w", m.dir, m.lockTimeout, ErrLocked)
	}
}

func (m *Manager) release() { <-m.sem }

// locked runs fn holding the manager's turn and the directory's lock, each
// waited for at most the lock timeout (ErrLocked).
func (m *Manager) locked(ctx context.Context, fn func() error) error {
	if err := m.acquire(ctx); err != nil {
		return err
	}
	defer m.release()
	if m.lock == nil {
		return fmt.Errorf("manager closed: %w", ErrNotMade)
	}
	lctx, cancel := context.WithTimeoutCause(ctx, m.lockTimeout, fmt.Errorf("another process held the lock of %s over %v: %w", m.dir, m.lockTimeout, ErrLocked))
	err := linux.Lock(lctx, m.lock)
	cancel()
	if err != nil && !errors.Is(err, linux.ErrNotSupported) {
		return err
	}
	defer linux.Unlock(m.lock)
	return fn()
}

func (m *Manager) daemonDir(owner string) string { return filepath.Join(m.dir, owner) }
