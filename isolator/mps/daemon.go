package mps

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/node"
)

// Daemon is a share's MPS control daemon, as its record holds it.
type Daemon struct {
	// Owner is the share's owner (its container's id).
	Owner string `json:"owner"`
	// GPU is the UUID of the one GPU or MIG device ("MIG-" UUID) the
	// daemon serves (its CUDA_VISIBLE_DEVICES), Index the GPU's index on
	// the node (a MIG device's parent's).
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
	// Slices, for the daemon of a GPU's concurrent slices (owner
	// SliceOwner(GPU)), is the count the GPU is split in; 0 for a memory
	// share's daemon of its own.
	Slices int `json:"slices,omitempty"`
	// Cgroup is the cgroup the daemon was placed in (WithCgroup), a path
	// in every hierarchy; "" when it stays in its starter's.
	Cgroup string `json:"cgroup,omitempty"`
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

// StartShare starts the daemon of the memory share al holds (Start, with
// the limits LimitsOf derives from al.Share) and returns it; for a
// concurrent slice (allocator.ShareSlice) it returns the daemon of the
// slice's GPU, shared by all its slices, started with the first of them
// and recording al.Owner as one of its tenants (see StartSlice); an
// allocation of whole GPUs, MIG devices or a time slice needs none (nil,
// nil). It is how every program that hands a memory share or a slice to a
// container starts its daemon, or finds it running (it is idempotent), or
// starts it again in place after a crash. A memory share or a slice and a
// nil manager is ErrNoManager.
func (m *Manager) StartShare(ctx context.Context, al allocator.Allocation) (*Daemon, error) {
	s := al.Share
	if s == nil || s.Mode != "" && s.Mode != allocator.ShareMemory && s.Mode != allocator.ShareSlice {
		return nil, nil
	}
	slice := s.Mode == allocator.ShareSlice
	what := al.Owner
	if slice {
		what += "'s slice"
	}
	if m == nil {
		return nil, fmt.Errorf("start the MPS daemon of %s: %w", what, ErrNoManager)
	}
	if len(al.Devices) != 1 {
		return nil, fmt.Errorf("start the MPS daemon of %s: a share of %d devices, want 1: %w", what, len(al.Devices), ErrInvalid)
	}
	// A memory share's daemon is its own; a slice's is its GPU's, which
	// counts the slice's owner among its tenants.
	owner := al.Owner
	tenant := ""
	count := 0
	if slice {
		owner = SliceOwner(al.Devices[0].UUID)
		tenant = al.Owner
		count = s.Slices
	}
	lim, err := LimitsOf(*s)
	if err != nil {
		return nil, fmt.Errorf("start the MPS daemon of %s: %w", what, err)
	}
	d, err := m.startAs(ctx, owner, al.Devices[0], lim, count, tenant)
	if err != nil {
		return nil, fmt.Errorf("start the MPS daemon of %s: %w", what, err)
	}
	return &d, nil
}

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
	d, err := m.startAs(ctx, owner, gpu, lim, 0, "")
	if err != nil {
		return Daemon{}, fmt.Errorf("start the MPS daemon of %s: %w", owner, err)
	}
	return d, nil
}

// startAs is the door of Start, StartSlice and StartShare: it checks the
// names of the daemon's owner and, for a GPU's slices (count > 0), of the
// slice's owner (tenant), once, and starts the daemon under the manager's
// lock (start).
func (m *Manager) startAs(ctx context.Context, owner string, gpu node.DeviceRef, lim Limits, count int, tenant string) (Daemon, error) {
	if err := m.made(); err != nil {
		return Daemon{}, err
	}
	names := []string{owner}
	if count > 0 {
		names = append(names, tenant)
	}
	for _, name := range names {
		if err := node.ValidateOwner(name); err != nil {
			return Daemon{}, fmt.Errorf("%w: %w", ErrInvalid, err)
		}
	}
	var d Daemon
	err := m.locked(ctx, func() error {
		var err error
		d, err = m.start(ctx, owner, gpu, lim, count, tenant)
		return err
	})
	return d, err
}

// start starts owner's daemon, as Start says. For the daemon of a GPU's
// concurrent slices, count is their count and tenant the slice's owner,
// added to the daemon's tenants (a running daemon's record is written
// again only when it lacks tenant); for a share's own daemon both are
// zero. owner and tenant are valid owner ids (startAs). The caller holds
// the lock.
func (m *Manager) start(ctx context.Context, owner string, gpu node.DeviceRef, lim Limits, count int, tenant string) (d Daemon, err error) {
	if gpu.UUID == "" || gpu.MIG != nil && !node.IsMIGUUID(gpu.UUID) {
		return d, fmt.Errorf("gpu %d (%q): a whole GPU with its UUID, or a MIG device with its own: %w", gpu.Index, gpu.UUID, ErrInvalid)
	}
	if err := lim.validate(); err != nil {
		return d, err
	}
	lim.MemoryBytes = lim.mib() << 20
	// again: a dead daemon of the same share, started again in place;
	// tenants: a slice daemon's.
	again, tenants := false, []string(nil)
	rec, rerr := m.readRecord(owner)
	old := rec.Daemon
	if rerr != nil {
		old = m.blank(owner)
	}
	switch {
	case rerr == nil && old.Alive && old.GPU == gpu.UUID && old.Limits == lim && old.Slices == count:
		if tenant == "" || slices.Contains(rec.Tenants, tenant) {
			return old, nil
		}
		if err := m.write(old, withTenant(rec.Tenants, tenant)); err != nil {
			return d, err
		}
		return old, nil
	case rerr == nil && old.Alive && (old.Slices == 0 || len(rec.Tenants) > 0):
		return d, fmt.Errorf("daemon %d serves gpu %s with %+v: %w", old.Pid, old.GPU, old.Limits, ErrExists)
	case rerr == nil && old.GPU == gpu.UUID && old.Limits == lim && old.Slices == count:
		// Its container may run on, its mounts of the directories in
		// place: the same directories serve the new daemon (and the
		// tenants it served).
		if err := m.clear(ctx, old); err != nil {
			return d, err
		}
		again, tenants = true, rec.Tenants
	case rerr == nil || !isNotExist(rerr) || m.hasDir(owner):
		// Another share's daemon, dead or ended; or an unreadable record,
		// or a directory whose removal did not finish (its container
		// wrote on in it): whatever it holds goes.
		if err := m.stop(ctx, old); err != nil {
			return d, err
		}
	}
	server, err := m.serverSource()
	if err != nil {
		return d, err
	}
	defer server.Close()
	d = m.blank(owner)
	d.GPU, d.Index, d.Limits, d.Started = gpu.UUID, gpu.Index, lim, time.Now().UTC()
	d.Cgroup = m.cgroupOf(owner)
	if count > 0 {
		d.Slices, tenants = count, withTenant(tenants, tenant)
	}
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
	if err := m.write(d, tenants); err != nil { // a record before the process: a crash leaves it found
		return d, err
	}
	log, err := os.OpenFile(filepath.Join(d.LogDir, "control.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return d, err
	}
	defer log.Close()
	began := time.Now()
	proc, err := m.startDaemon(ctx, d, log, server, again)
	if err != nil {
		return d, err
	}
	d.Pid, d.Start = proc.Pid, proc.Start
	if err := m.write(d, tenants); err != nil {
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
// still write) with ErrUnsafeRestart. The servers it starts run a copy of
// server (the driver's, serverSource) that its namespace alone holds, which
// their users may run but not read (serverMode). The daemon joins its
// cgroup (d.Cgroup) as soon as it runs. It returns the daemon's process;
// on error none runs.
func (m *Manager) startDaemon(ctx context.Context, d Daemon, log, server *os.File, again bool) (linux.Process, error) {
	cmd, err := m.startCmd(d, log, server, again)
	if err != nil {
		return linux.Process{}, err
	}
	go cmd.Wait() // reaped whenever it ends
	pid := cmd.Process.Pid
	st, err := linux.ReadProcStat(m.procRoot, pid)
	if err != nil {
		linux.Kill(pid)
		return linux.Process{}, fmt.Errorf("daemon %d: %w", pid, err)
	}
	proc := linux.Process{Pid: pid, Start: st.Start}
	if d.Cgroup == "" {
		return proc, nil
	}
	hs, err := m.hierarchies()
	if err == nil {
		err = linux.MakeCgroup(hs, d.Cgroup)
	}
	if err == nil {
		err = linux.MoveToCgroup(hs, d.Cgroup, pid, m.cgroupNS)
	}
	if err != nil {
		linux.End(context.WithoutCancel(ctx), m.procRoot, proc, stopBound)
		return linux.Process{}, fmt.Errorf("place daemon %d in cgroup %s: %w", pid, d.Cgroup, err)
	}
	return proc, nil
}

// startCmd starts d's control daemon's process, as startDaemon says.
func (m *Manager) startCmd(d Daemon, log, server *os.File, again bool) (*exec.Cmd, error) {
	untrusted := true
	for {
		cmd := exec.Command(m.daemonBin(), "-f")
		cmd.Env = m.env(d.GPU, d.Mark)
		cmd.Stdout, cmd.Stderr = log, log
		mounts := []linux.NamespaceMount{
			{Target: daemonTmp, Mode: 0o777 | os.ModeSticky},
			{Target: filepath.Join(daemonServerDir, ServerBinary), Content: server, Mode: serverMode},
			{Source: d.PipeDir, Target: daemonPipeDir, Untrusted: untrusted},
			{Source: d.LogDir, Target: daemonLogDir},
			{Source: d.ShmDir, Target: daemonShmDir, Untrusted: untrusted},
		}
		start := m.startFn
		if start == nil {
			start = m.startFrom
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
// control daemon starts nvidia-cuda-mps-server by name: its namespace's
// copy comes first) and the library path of a
// driver root other than / (driverDirs) before the caller's (a driver
// outside the loader's default directories).
func (m *Manager) env(uuid, mark string) []string {
	bins, libs := driverDirs(m.driverRoot, m.nsDriverRoot)
	path := strings.Join(append([]string{daemonServerDir, filepath.Dir(m.daemonBin())}, bins...), ":") + ":/usr/local/nvidia/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	env := []string{
		"CUDA_VISIBLE_DEVICES=" + uuid,
		MarkEnv + "=" + mark,
		"CUDA_MPS_PIPE_DIRECTORY=" + daemonPipeDir,
		"CUDA_MPS_LOG_DIRECTORY=" + daemonLogDir,
		"PATH=" + path,
	}
	if v, ok := os.LookupEnv("LD_LIBRARY_PATH"); ok {
		libs = append(libs, v)
	}
	if len(libs) > 0 {
		env = append(env, "LD_LIBRARY_PATH="+strings.Join(libs, ":"))
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

// hasDir reports whether owner has a directory in the manager's (a link
// there counts too: it goes).
func (m *Manager) hasDir(owner string) bool {
	_, err := os.Lstat(m.daemonDir(owner))
	return err == nil
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
		if !linux.Alive(m.procRoot, proc) {
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
