package mps

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"time"

	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/node"
)

// Stop stops owner's daemon (quit, then SIGKILL for one that does not end
// within seconds, and the servers it left) and removes its directory. An
// owner without one is not an error. For an owner of a concurrent slice,
// a tenant of a GPU's slice daemon (StartSlice), Stop drops owner from the
// daemon's tenants and stops the daemon when owner was its last; the
// daemon's own name (SliceOwner) stops it whatever its tenants.
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
				return m.leave(ctx, owner)
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

// stop ends d's daemon and its servers and takes back what it held (its
// mounts, cgroup and directory). The caller holds the lock.
func (m *Manager) stop(ctx context.Context, d Daemon) error {
	rem := m.remains(ctx, d)
	proc := linux.Process{Pid: d.Pid, Start: d.Start}
	if d.Pid == 0 {
		// Killed while it started: the holder of its control lock, if
		// any, is its process.
		if pid, err := linux.LockHolder(filepath.Join(d.PipeDir, "control_lock")); err == nil && pid > 0 {
			if p, err := linux.ProcessOf(m.procRoot, pid); err == nil {
				proc = p
			}
		}
	}
	if proc.Pid > 0 && linux.Alive(m.procRoot, proc) {
		// quit first, which ends its servers as MPS ends them; what does
		// not end within stopBound is killed.
		if _, err := m.control(ctx, d.PipeDir, "quit"); err != nil {
			m.log.WarnContext(ctx, "mps daemon did not take quit", "owner", d.Owner, "pid", proc.Pid, "err", err)
		} else {
			linux.WaitGone(ctx, m.procRoot, proc, stopBound)
		}
	}
	rem.Processes = []linux.Process{proc}
	if err := linux.Reclaim(ctx, m.procRoot, rem, stopBound); err != nil {
		return daemonErr(err)
	}
	m.log.InfoContext(ctx, "mps daemon stopped", "owner", d.Owner, "pid", proc.Pid)
	return nil
}

// remains are what d's daemon leaves once it is stopped: the servers its
// mark names, its tmpfs mounts (taken first: nothing is removed through
// them, and nothing mounted is left under a directory that no longer is),
// its cgroup and its parent when no other daemon's is left in it, and its
// directory.
func (m *Manager) remains(ctx context.Context, d Daemon) linux.Remains {
	r := linux.Remains{Marked: daemonMark(d.Mark), Mounts: []string{d.PipeDir, d.ShmDir}, Dir: d.Dir}
	if d.Cgroup != "" && linux.CheckCgroupPath(d.Cgroup) == nil && path.Base(path.Dir(d.Cgroup)) == CgroupDir {
		hs, err := m.hierarchies()
		if err != nil && !errors.Is(err, linux.ErrNotSupported) {
			m.log.WarnContext(ctx, "mps daemon's cgroup kept: its hierarchies cannot be read", "owner", d.Owner, "cgroup", d.Cgroup, "err", err)
		}
		if err == nil {
			r.Hierarchies, r.Cgroup, r.ParentToo = hs, d.Cgroup, true
		}
	}
	return r
}

// clear readies the directories of d, a dead daemon, for another: it kills
// what MPS processes it left and removes what they left in its pipe
// directory (sockets, the lock), keeping the directories themselves, which
// a running container has mounted. The caller holds the lock.
func (m *Manager) clear(ctx context.Context, d Daemon) error {
	rem := linux.Remains{Marked: daemonMark(d.Mark), Empty: []string{d.PipeDir}}
	if err := linux.Reclaim(ctx, m.procRoot, rem, stopBound); err != nil {
		return fmt.Errorf("what a dead daemon left: %w", daemonErr(err))
	}
	return nil
}

// daemonErr is err, matching ErrDaemon as well when a process would not
// end.
func daemonErr(err error) error {
	if errors.Is(err, linux.ErrStillRuns) {
		return fmt.Errorf("%w: %w", err, ErrDaemon)
	}
	return err
}

// MarkEnv names the variable that carries a daemon's mark (Daemon.Mark)
// in the environment of its process and its servers.
const MarkEnv = "GPUISO_MPS_DAEMON"

// mpsComm begins the command of every MPS process (the control daemon,
// nvidia-cuda-mps-control, and its servers, nvidia-cuda-mps-server), as
// /proc/<pid>/comm shows it.
const mpsComm = "nvidia-cuda-mps"

// daemonMark names the MPS processes that carry mark: a daemon's and its
// servers (none for "").
func daemonMark(mark string) linux.Mark {
	if mark == "" {
		return linux.Mark{}
	}
	return linux.Mark{Comm: mpsComm, Env: MarkEnv + "=" + mark}
}

// Strays lists the live processes under procRoot whose command is MPS's
// own (nvidia-cuda-mps-control or nvidia-cuda-mps-server) and whose
// environment carries mark (MarkEnv=mark): what a daemon killed without
// quit leaves.
func Strays(procRoot, mark string) []node.Process {
	return linux.Marked(procRoot, daemonMark(mark))
}
