package mps

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/node"
)

// Limits are what a daemon holds its share's container to.
type Limits struct {
	// MemoryBytes is the device memory each client process may pin
	// (set_default_device_pinned_mem_limit), rounded down to whole MiB.
	MemoryBytes uint64 `json:"memoryBytes"`
	// ComputePercent is the active thread percentage of each client
	// (set_default_active_thread_percentage); 0 means no limit.
	ComputePercent int `json:"computePercent,omitempty"`
}

func (l Limits) validate() error {
	if l.MemoryBytes < 1<<20 {
		return fmt.Errorf("memory limit %d bytes, want at least 1 MiB: %w", l.MemoryBytes, ErrInvalid)
	}
	if l.ComputePercent < 0 || l.ComputePercent > 100 {
		return fmt.Errorf("compute percentage %d, want 1 to 100 (0: no limit): %w", l.ComputePercent, ErrInvalid)
	}
	return nil
}

func (l Limits) mib() uint64 { return l.MemoryBytes >> 20 }

// Daemon is a share's MPS control daemon, as its record holds it.
type Daemon struct {
	// Owner is the share's owner (its container's id).
	Owner string `json:"owner"`
	// GPU is the UUID of the one GPU the daemon serves (its
	// CUDA_VISIBLE_DEVICES), Index its index on the node.
	GPU   string `json:"gpu"`
	Index int    `json:"index"`
	// Limits are the limits the daemon was given.
	Limits Limits `json:"limits"`
	// Pid and Start name the daemon's process (its start time, clock ticks
	// since boot, tells it from a later process of the same pid); 0 while
	// it starts.
	Pid   int    `json:"pid,omitempty"`
	Start uint64 `json:"start,omitempty"`
	// Mark is the daemon's own mark, in the environment of its process
	// and of the servers it starts (MarkEnv): how a recovery finds the
	// servers of a daemon that was killed, whatever their pids.
	Mark string `json:"mark"`
	// Dir is the daemon's directory in the manager's; PipeDir, LogDir and
	// ShmDir are in it: the pipe directory a container gets (bound at
	// isolator.MPSPipeDir), the daemon's logs, and the directory the daemon
	// and its container have as /dev/shm.
	Dir     string `json:"dir"`
	PipeDir string `json:"pipeDir"`
	LogDir  string `json:"logDir"`
	ShmDir  string `json:"shmDir"`
	// Started is when it was started.
	Started time.Time `json:"started"`
	// Alive tells (List, Start) whether the daemon's process runs.
	Alive bool `json:"-"`
}

// Where a daemon finds its directories in its own mount namespace: the
// same paths its container's clients use (isolator.MPSPipeDir and
// isolator.MPSShmDir), on a tmpfs of its own at /tmp.
const (
	daemonTmp     = "/tmp"
	daemonPipeDir = "/tmp/nvidia-mps"
	daemonLogDir  = "/tmp/nvidia-mps-log"
	daemonShmDir  = "/dev/shm"
)

// record is a daemon's record file in its directory.
const (
	recordFile    = "daemon.json"
	recordVersion = 1
	lockFile      = ".lock"
)

type record struct {
	Version int `json:"version"`
	Daemon
}

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
	logger      *slog.Logger
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
// not in PATH (default /).
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

	// sem, with the lock file, lets one change at a time work on the
	// directory: a channel rather than a mutex, so that every wait for it
	// has a deadline.
	sem  chan struct{}
	lock *os.File

	// startFn starts a daemon's process (linux.StartDaemon when nil).
	startFn func(*exec.Cmd, []linux.NamespaceMount) error
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
		shmBytes: DefaultShmBytes, pipeBytes: DefaultPipeBytes, registry: DefaultRegistry, logger: slog.New(slog.DiscardHandler)}
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
		shmBytes: c.shmBytes, pipeBytes: c.pipeBytes, plainDirs: c.plainDirs, log: c.logger, sem: make(chan struct{}, 1), lock: f}, nil
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

// Start gives owner's share of gpu its daemon, with limits, and returns it:
// a control daemon of its own, serving that GPU alone, in a mount
// namespace of its own, its limits set and read back before Start returns.
// A running daemon of owner with the same GPU and limits is returned as it
// is (Start is idempotent); one with others is ErrExists. A dead one of the
// same share is started again in its directories, which its container may
// still have mounted and write (where the kernel cannot keep the daemon
// from following links planted there, it is not: ErrUnsafeRestart); what
// a dead one of another share left is removed first. On error nothing is
// left.
func (m *Manager) Start(ctx context.Context, owner string, gpu node.DeviceRef, lim Limits) (Daemon, error) {
	if err := m.made(); err != nil {
		return Daemon{}, err
	}
	var d Daemon
	err := m.locked(ctx, func() error {
		var err error
		d, err = m.start(ctx, owner, gpu, lim)
		return err
	})
	if err != nil {
		return Daemon{}, fmt.Errorf("start the MPS daemon of %s: %w", owner, err)
	}
	return d, nil
}

func (m *Manager) start(ctx context.Context, owner string, gpu node.DeviceRef, lim Limits) (d Daemon, err error) {
	if err := node.ValidateOwner(owner); err != nil {
		return d, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if gpu.UUID == "" || node.IsMIGUUID(gpu.UUID) || gpu.MIG != nil {
		return d, fmt.Errorf("gpu %d (%q): a whole GPU with a UUID: %w", gpu.Index, gpu.UUID, ErrInvalid)
	}
	if err := lim.validate(); err != nil {
		return d, err
	}
	lim.MemoryBytes = lim.mib() << 20
	again := false // a dead daemon of the same share, started again in place
	if old, err := m.read(owner); err == nil {
		switch {
		case old.Alive && old.GPU == gpu.UUID && old.Limits == lim:
			return old, nil
		case old.Alive:
			return d, fmt.Errorf("daemon %d serves gpu %s with %+v: %w", old.Pid, old.GPU, old.Limits, ErrExists)
		case old.GPU == gpu.UUID && old.Limits == lim:
			// Its container may run on, its mounts of the directories
			// in place: the same directories serve the new daemon.
			if err := m.clear(ctx, old); err != nil {
				return d, err
			}
			again = true
		default:
			if err := m.stop(ctx, old); err != nil {
				return d, err
			}
		}
	} else if _, serr := os.Lstat(m.daemonDir(owner)); !isNotExist(err) || serr == nil {
		// An unreadable record, or a directory whose removal did not
		// finish (its container wrote on in it): whatever it holds goes.
		if err := m.stop(ctx, m.blank(owner)); err != nil {
			return d, err
		}
	}
	d = m.blank(owner)
	d.GPU, d.Index, d.Limits, d.Started = gpu.UUID, gpu.Index, lim, time.Now().UTC()
	var mark [12]byte
	if _, err := rand.Read(mark[:]); err != nil {
		return d, err
	}
	d.Mark = hex.EncodeToString(mark[:])
	defer func() {
		if err != nil {
			m.stop(context.WithoutCancel(ctx), d)
		}
	}()
	if err := os.Mkdir(d.Dir, 0o700); err != nil && !(again && os.IsExist(err)) {
		return d, err
	}
	// The daemon's server runs as its client's user: the directories are
	// every user's, as /tmp and /dev/shm are; the host reaches them only
	// through the manager's directory, which is root's.
	for _, sub := range []string{d.PipeDir, d.LogDir, d.ShmDir} {
		if err := os.Mkdir(sub, 0o755); err != nil && !(again && os.IsExist(err)) {
			return d, err
		}
	}
	// Those the container writes are tmpfs mounts of their own, bounded,
	// never the disk the manager's directory is on. A dead daemon started
	// again in place keeps what its container may hold: its mounts, or,
	// for a share an earlier release started, its plain directories.
	if !again && !m.plainDirs {
		if err := m.mountDirs(d); err != nil {
			return d, err
		}
	}
	for _, sub := range []string{d.PipeDir, d.LogDir, d.ShmDir} {
		if err := os.Chmod(sub, 0o777|os.ModeSticky); err != nil {
			return d, err
		}
	}
	if err := m.write(d); err != nil { // a record before the process: a crash leaves it found
		return d, err
	}
	log, err := os.OpenFile(filepath.Join(d.LogDir, "control.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return d, err
	}
	defer log.Close()
	began := time.Now()
	cmd, err := m.startDaemon(d, log, again)
	if err != nil {
		return d, err
	}
	go cmd.Wait() // reaped whenever it ends
	d.Pid = cmd.Process.Pid
	st, err := linux.ReadProcStat(m.procRoot, d.Pid)
	if err != nil {
		linux.Kill(d.Pid)
		return d, fmt.Errorf("daemon %d: %w", d.Pid, err)
	}
	d.Start = st.Start
	if err := m.write(d); err != nil {
		return d, err
	}
	if err := m.ready(ctx, d); err != nil {
		return d, err
	}
	if err := m.setLimits(ctx, d); err != nil {
		return d, err
	}
	d.Alive = true
	m.log.InfoContext(ctx, "mps daemon started", "owner", owner, "gpu", gpu.UUID, "pid", d.Pid, "memory MiB", lim.mib(), "compute %", lim.ComputePercent, "took", time.Since(began))
	return d, nil
}

// startDaemon starts d's control daemon, logging to log, in a mount
// namespace where its directories are where its environment says. The
// pipe and shared memory directories are its share's container's to
// write: the daemon (root, as its starter) is given them nosymfollow, so
// that it follows no link the container plants there to a host file (it
// creates, chmods and binds files there by name). A kernel without
// nosymfollow (before Linux 5.10) has them bound as they are for a new
// daemon, whose directories no container has seen yet, and refuses again
// (a dead daemon started again in the directories its container may
// still write) with ErrUnsafeRestart.
func (m *Manager) startDaemon(d Daemon, log *os.File, again bool) (*exec.Cmd, error) {
	untrusted := true
	for {
		cmd := exec.Command(m.bin, "-f")
		cmd.Env = m.env(d.GPU, d.Mark)
		cmd.Stdout, cmd.Stderr = log, log
		mounts := []linux.NamespaceMount{
			{Target: daemonTmp, Mode: 0o777 | os.ModeSticky},
			{Source: d.PipeDir, Target: daemonPipeDir, Untrusted: untrusted},
			{Source: d.LogDir, Target: daemonLogDir},
			{Source: d.ShmDir, Target: daemonShmDir, Untrusted: untrusted},
		}
		start := m.startFn
		if start == nil {
			start = linux.StartDaemon
		}
		err := start(cmd, mounts)
		switch {
		case err == nil:
			return cmd, nil
		case errors.Is(err, linux.ErrNotSupported) && untrusted && again:
			return nil, fmt.Errorf("start %s in the directories of a share whose container may run: %w: %w", m.bin, err, ErrUnsafeRestart)
		case errors.Is(err, linux.ErrNotSupported) && untrusted:
			untrusted = false
		default:
			return nil, fmt.Errorf("start %s: %w", m.bin, err)
		}
	}
}

// env is the daemon's environment: its GPU, its directories as its own
// namespace shows them, the search path of the driver's programs (the
// control daemon starts nvidia-cuda-mps-server) and the caller's library
// path (a driver outside the loader's default directories).
func (m *Manager) env(uuid, mark string) []string {
	path := filepath.Dir(m.bin) + ":/usr/local/nvidia/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	env := []string{
		"CUDA_VISIBLE_DEVICES=" + uuid,
		MarkEnv + "=" + mark,
		"CUDA_MPS_PIPE_DIRECTORY=" + daemonPipeDir,
		"CUDA_MPS_LOG_DIRECTORY=" + daemonLogDir,
		"PATH=" + path,
	}
	if v, ok := os.LookupEnv("LD_LIBRARY_PATH"); ok {
		env = append(env, "LD_LIBRARY_PATH="+v)
	}
	return env
}

// mountDirs mounts a tmpfs of its size on each of d's pipe and shared
// memory directories, new and empty, that has none yet.
func (m *Manager) mountDirs(d Daemon) error {
	for _, t := range []struct {
		dir           string
		bytes, inodes uint64
	}{{d.PipeDir, m.pipeBytes, pipeInodes}, {d.ShmDir, m.shmBytes, 0}} {
		mounted, err := linux.IsMountPoint(t.dir)
		if err != nil {
			return err
		}
		if mounted {
			continue
		}
		if err := linux.MountSizedTmpfs(t.dir, 0o777|os.ModeSticky, t.bytes, t.inodes); err != nil {
			return err
		}
	}
	return nil
}

// unmountDirs detaches the tmpfs mounts of d's directories, not following
// links; what is not mounted, or not there, is not an error.
func unmountDirs(d Daemon) error {
	var errs []error
	for _, dir := range []string{d.PipeDir, d.ShmDir} {
		if err := linux.UnmountAll(dir); err != nil && !errors.Is(err, linux.ErrNotSupported) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// blank is owner's daemon before it runs: its directories.
func (m *Manager) blank(owner string) Daemon {
	dir := m.daemonDir(owner)
	return Daemon{Owner: owner, Dir: dir, PipeDir: filepath.Join(dir, "pipe"), LogDir: filepath.Join(dir, "log"), ShmDir: filepath.Join(dir, "shm")}
}

// ready waits until d's daemon answers on its control socket: the socket
// is there and d's process holds the control lock. A daemon that ends
// first is ErrDaemon, with the end of its log.
func (m *Manager) ready(ctx context.Context, d Daemon) error {
	ctx, cancel := context.WithTimeout(ctx, m.timeout)
	defer cancel()
	wait := 500 * time.Microsecond
	proc := linux.Process{Pid: d.Pid, Start: d.Start}
	for {
		if _, err := os.Stat(filepath.Join(d.PipeDir, "control")); err == nil {
			if pid, err := linux.LockHolder(filepath.Join(d.PipeDir, "control_lock")); err == nil && pid == d.Pid {
				return nil
			}
		}
		if !proc.Alive(m.procRoot) {
			return fmt.Errorf("daemon %d ended at its start: %s: %w", d.Pid, logTail(d.LogDir), ErrDaemon)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("daemon %d did not answer within %v: %w", d.Pid, m.timeout, ErrDaemon)
		case <-t.C:
		}
		wait = min(2*wait, 20*time.Millisecond)
	}
}

// setLimits gives d's daemon its limits and reads them back.
func (m *Manager) setLimits(ctx context.Context, d Daemon) error {
	mib := strconv.FormatUint(d.Limits.mib(), 10)
	if _, err := m.control(ctx, d.PipeDir, "set_default_device_pinned_mem_limit 0 "+mib+"M"); err != nil {
		return err
	}
	if d.Limits.ComputePercent > 0 {
		if _, err := m.control(ctx, d.PipeDir, "set_default_active_thread_percentage "+strconv.Itoa(d.Limits.ComputePercent)); err != nil {
			return err
		}
	}
	got, err := m.query(ctx, d)
	if err != nil {
		return err
	}
	if !got.holds(d.Limits) {
		return fmt.Errorf("daemon %d holds %+v after being given %+v: %w", d.Pid, got, d.Limits, ErrDaemon)
	}
	return nil
}

// Held is what a daemon says it holds: its default pinned memory limit
// (as a range of MiB: it prints whole GiB rounded down) and its default
// active thread percentage.
type Held struct {
	MemoryMinMiB, MemoryMaxMiB uint64
	ComputePercent             float64
	// MemorySet is false when the daemon has no memory limit at all.
	MemorySet bool
}

// holds tells whether h is what l asks for.
func (h Held) holds(l Limits) bool {
	want := float64(l.ComputePercent)
	if l.ComputePercent == 0 {
		want = 100
	}
	return h.MemorySet && h.MemoryMinMiB <= l.mib() && l.mib() <= h.MemoryMaxMiB && h.ComputePercent == want
}

// query asks d's daemon for its limits.
func (m *Manager) query(ctx context.Context, d Daemon) (Held, error) {
	var h Held
	mem, err := m.control(ctx, d.PipeDir, "get_default_device_pinned_mem_limit 0")
	if err != nil {
		return h, err
	}
	if mem != "" {
		if h.MemoryMinMiB, h.MemoryMaxMiB, err = parseMemLimit(mem); err != nil {
			return h, err
		}
		h.MemorySet = true
	}
	pct, err := m.control(ctx, d.PipeDir, "get_default_active_thread_percentage")
	if err != nil {
		return h, err
	}
	if h.ComputePercent, err = parsePercent(pct); err != nil {
		return h, err
	}
	return h, nil
}

// Held asks owner's running daemon what it holds: the limits it applies
// to the next server it starts. A container that reaches the daemon's
// control socket can change them (see the package documentation); Held is
// how to tell.
func (m *Manager) Held(ctx context.Context, owner string) (Held, error) {
	if err := m.made(); err != nil {
		return Held{}, err
	}
	d, err := m.read(owner)
	if isNotExist(err) {
		return Held{}, fmt.Errorf("limits of %s: %w", owner, ErrUnknownOwner)
	}
	if err != nil {
		return Held{}, fmt.Errorf("limits of %s: %w", owner, err)
	}
	if !d.Alive {
		return Held{}, fmt.Errorf("limits of %s: daemon %d is not running: %w", owner, d.Pid, ErrDaemon)
	}
	h, err := m.query(ctx, d)
	if err != nil {
		return Held{}, fmt.Errorf("limits of %s: %w", owner, err)
	}
	return h, nil
}

// Stop stops owner's daemon (quit, then SIGKILL for one that does not end
// within seconds, and the servers it left) and removes its directory. An
// owner without one is not an error.
func (m *Manager) Stop(ctx context.Context, owner string) error {
	if err := m.made(); err != nil {
		return err
	}
	if err := node.ValidateOwner(owner); err != nil {
		return fmt.Errorf("stop the MPS daemon of %q: %w: %w", owner, ErrInvalid, err)
	}
	err := m.locked(ctx, func() error {
		d, err := m.read(owner)
		if isNotExist(err) {
			if _, serr := os.Stat(m.daemonDir(owner)); serr != nil {
				return nil
			}
			d = m.blank(owner)
		} else if err != nil {
			d = m.blank(owner)
		}
		return m.stop(ctx, d)
	})
	if err != nil {
		return fmt.Errorf("stop the MPS daemon of %s: %w", owner, err)
	}
	return nil
}

// stopBound bounds the wait for a daemon to end after quit.
const stopBound = 5 * time.Second

// stop ends d's daemon and its servers and removes its directory. The
// caller holds the lock.
func (m *Manager) stop(ctx context.Context, d Daemon) error {
	proc := linux.Process{Pid: d.Pid, Start: d.Start}
	if d.Pid == 0 {
		// Killed while it started: the holder of its control lock, if
		// any, is its process.
		if pid, err := linux.LockHolder(filepath.Join(d.PipeDir, "control_lock")); err == nil && pid > 0 {
			if st, err := linux.ReadProcStat(m.procRoot, pid); err == nil {
				proc = linux.Process{Pid: pid, Start: st.Start}
			}
		}
	}
	if proc.Pid > 0 && proc.Alive(m.procRoot) {
		_, err := m.control(ctx, d.PipeDir, "quit")
		if err != nil {
			m.log.WarnContext(ctx, "mps daemon did not take quit", "owner", d.Owner, "pid", proc.Pid, "err", err)
		}
		if err != nil || !m.waitGone(ctx, proc, stopBound) {
			linux.Kill(proc.Pid)
			m.waitGone(ctx, proc, stopBound)
		}
	}
	var errs []error
	for _, p := range m.strays(d) {
		m.log.InfoContext(ctx, "killing what an mps daemon left", "owner", d.Owner, "pid", p.Pid)
		if err := linux.Kill(p.Pid); err != nil {
			errs = append(errs, err)
		}
		m.waitGone(ctx, p, stopBound)
	}
	if proc.Pid > 0 && proc.Alive(m.procRoot) {
		errs = append(errs, fmt.Errorf("daemon %d still runs: %w", proc.Pid, ErrDaemon))
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	// Its tmpfs mounts go first: nothing is removed through them, and
	// nothing mounted is left under a directory that no longer is.
	if err := unmountDirs(d); err != nil {
		return err
	}
	if err := os.RemoveAll(d.Dir); err != nil {
		return err
	}
	m.log.InfoContext(ctx, "mps daemon stopped", "owner", d.Owner, "pid", proc.Pid)
	return nil
}

// clear readies the directories of d, a dead daemon, for another: it kills
// what MPS processes it left and removes what they left in its pipe
// directory (sockets, the lock), keeping the directories themselves, which
// a running container has mounted. The caller holds the lock.
func (m *Manager) clear(ctx context.Context, d Daemon) error {
	for _, p := range m.strays(d) {
		linux.Kill(p.Pid)
		if !m.waitGone(ctx, p, stopBound) {
			return fmt.Errorf("process %d of a dead daemon still runs: %w", p.Pid, ErrDaemon)
		}
	}
	entries, err := os.ReadDir(d.PipeDir)
	if err != nil && !isNotExist(err) {
		return err
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(d.PipeDir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// waitGone polls until p has ended, at most bound; it reports whether it
// did.
func (m *Manager) waitGone(ctx context.Context, p linux.Process, bound time.Duration) bool {
	deadline := time.Now().Add(bound)
	wait := 200 * time.Microsecond
	for p.Alive(m.procRoot) {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(wait)
		wait = min(2*wait, 20*time.Millisecond)
	}
	return true
}

// MarkEnv names the variable that carries a daemon's mark (Daemon.Mark)
// in the environment of its process and its servers.
const MarkEnv = "GPUISO_MPS_DAEMON"

// strays are the live MPS processes (a control daemon or server) that
// carry d's mark: what a daemon killed without quit leaves.
func (m *Manager) strays(d Daemon) []linux.Process {
	if d.Mark == "" {
		return nil
	}
	var out []linux.Process
	for _, p := range Strays(m.procRoot, d.Mark) {
		out = append(out, linux.Process(p))
	}
	return out
}

// Strays lists the live processes under procRoot whose command is MPS's
// own (nvidia-cuda-mps-control or nvidia-cuda-mps-server) and whose
// environment carries mark (MarkEnv=mark).
func Strays(procRoot, mark string) []node.Process {
	entries, err := os.ReadDir(procRoot)
	if err != nil || mark == "" {
		return nil
	}
	want := []byte(MarkEnv + "=" + mark)
	var out []node.Process
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		comm, err := os.ReadFile(filepath.Join(procRoot, e.Name(), "comm"))
		if err != nil || !strings.HasPrefix(strings.TrimSpace(string(comm)), "nvidia-cuda-mps") {
			continue
		}
		env, err := os.ReadFile(filepath.Join(procRoot, e.Name(), "environ"))
		if err != nil || !slices.ContainsFunc(bytes.Split(env, []byte{0}), func(kv []byte) bool { return bytes.Equal(kv, want) }) {
			continue
		}
		st, err := linux.ReadProcStat(procRoot, pid)
		if err != nil || st.Exited() {
			continue
		}
		out = append(out, node.Process{Pid: pid, Start: st.Start})
	}
	return out
}

// List returns the daemons of the manager's directory, by owner, each
// with Alive set. A directory whose record does not read comes as a
// daemon with only Owner and Dir.
func (m *Manager) List(ctx context.Context) ([]Daemon, error) {
	if err := m.made(); err != nil {
		return nil, err
	}
	owners, err := m.owners()
	if err != nil {
		return nil, fmt.Errorf("list MPS daemons: %w", err)
	}
	var out []Daemon
	for _, o := range owners {
		d, err := m.read(o)
		if isNotExist(err) {
			if _, serr := os.Stat(m.daemonDir(o)); serr != nil {
				continue // stopped since
			}
		}
		if err != nil {
			d = m.blank(o)
		}
		out = append(out, d)
	}
	return out, nil
}

// Daemons lists the daemons recorded under dir, a manager's directory, as
// List does, without a manager: it needs no control binary, takes no lock
// and changes nothing (a program that only shows them, say). A directory
// that does not exist holds none.
func Daemons(ctx context.Context, dir string) ([]Daemon, error) {
	if _, err := os.Stat(dir); isNotExist(err) {
		return nil, nil
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("list MPS daemons: %w", err)
	}
	m := &Manager{dir: abs, procRoot: node.DefaultProcRoot, sem: make(chan struct{}, 1)} // made, for List
	return m.List(ctx)
}

// Sweep stops every daemon whose owner keep does not keep, and removes
// what dead daemons of kept owners left (their servers) and what commands
// to daemons left when their process was killed: the recovery of a
// process that lost track of its shares. It returns the owners whose
// daemons it stopped, sorted. A kept owner's dead daemon is not restarted
// here: Start does that.
func (m *Manager) Sweep(ctx context.Context, keep func(owner string) bool) ([]string, error) {
	if err := m.made(); err != nil {
		return nil, err
	}
	var stopped []string
	var errs []error
	err := m.locked(ctx, func() error {
		owners, err := m.owners()
		if err != nil {
			return err
		}
		for _, o := range owners {
			d, err := m.read(o)
			if err != nil {
				d = m.blank(o)
			}
			if keep != nil && keep(o) {
				if !d.Alive && d.Pid > 0 {
					for _, p := range m.strays(d) {
						linux.Kill(p.Pid)
					}
				}
				continue
			}
			if err := m.stop(ctx, d); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", o, err))
				continue
			}
			stopped = append(stopped, o)
		}
		return m.dropControls()
	})
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return stopped, fmt.Errorf("sweep MPS daemons: %w", err)
	}
	return stopped, nil
}

// owners lists the owners with a directory, sorted.
func (m *Manager) owners() ([]string, error) {
	entries, err := os.ReadDir(m.dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if e.IsDir() && node.ValidateOwner(e.Name()) == nil {
			out = append(out, e.Name())
		}
	}
	slices.Sort(out)
	return out, nil
}

// read reads owner's record, with Alive set.
func (m *Manager) read(owner string) (Daemon, error) {
	b, err := os.ReadFile(filepath.Join(m.daemonDir(owner), recordFile))
	if err != nil {
		return Daemon{}, err
	}
	var r record
	if err := json.Unmarshal(b, &r); err != nil {
		return Daemon{}, fmt.Errorf("record of %s: %w: %v", owner, ErrDaemon, err)
	}
	if r.Version != recordVersion || r.Owner != owner {
		return Daemon{}, fmt.Errorf("record of %s: version %d, owner %q: %w", owner, r.Version, r.Owner, ErrDaemon)
	}
	d := r.Daemon
	want := m.blank(owner)
	d.Dir, d.PipeDir, d.LogDir, d.ShmDir = want.Dir, want.PipeDir, want.LogDir, want.ShmDir
	d.Alive = d.Pid > 0 && linux.Process{Pid: d.Pid, Start: d.Start}.Alive(m.procRoot)
	return d, nil
}

// write replaces d's record atomically.
func (m *Manager) write(d Daemon) error {
	b, err := json.Marshal(record{Version: recordVersion, Daemon: d})
	if err != nil {
		return err
	}
	return linux.ReplaceFile(filepath.Join(d.Dir, recordFile), b, 0o600)
}

// logTail is the end of a daemon's log, for an error.
func logTail(dir string) string {
	f, err := os.Open(filepath.Join(dir, "control.log"))
	if err != nil {
		return "no log"
	}
	defer f.Close()
	b, _ := io.ReadAll(io.LimitReader(f, 1<<16))
	s := strings.TrimSpace(string(b))
	if len(s) > 300 {
		s = s[len(s)-300:]
	}
	if s == "" {
		return "empty log"
	}
	return strings.ReplaceAll(s, "\n", " | ")
}
