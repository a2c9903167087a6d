package mps

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
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

// stop ends d's daemon and its servers and removes its directory. The
// caller holds the lock.
func (m *Manager) stop(ctx context.Context, d Daemon) error {
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
	var errs []error
	if proc.Pid > 0 && linux.Alive(m.procRoot, proc) {
		_, err := m.control(ctx, d.PipeDir, "quit")
		if err != nil {
			m.log.WarnContext(ctx, "mps daemon did not take quit", "owner", d.Owner, "pid", proc.Pid, "err", err)
		}
		if err != nil || !linux.WaitGone(ctx, m.procRoot, proc, stopBound) {
			if err := linux.End(ctx, m.procRoot, proc, stopBound); err != nil {
				errs = append(errs, fmt.Errorf("daemon: %w: %w", err, ErrDaemon))
			}
		}
	}
	for _, p := range m.strays(d) {
		m.log.InfoContext(ctx, "killing what an mps daemon left", "owner", d.Owner, "pid", p.Pid)
		if err := linux.End(ctx, m.procRoot, p, stopBound); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	// Its tmpfs mounts go first: nothing is removed through them, and
	// nothing mounted is left under a directory that no longer is.
	if err := unmountDirs(d); err != nil {
		return err
	}
	if err := m.unplace(ctx, d); err != nil {
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
		if err := linux.End(ctx, m.procRoot, p, stopBound); err != nil {
			return fmt.Errorf("what a dead daemon left: %w: %w", err, ErrDaemon)
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

// MarkEnv names the variable that carries a daemon's mark (Daemon.Mark)
// in the environment of its process and its servers.
const MarkEnv = "GPUISO_MPS_DAEMON"

// strays are the live MPS processes (a control daemon or server) that
// carry d's mark: what a daemon killed without quit leaves.
func (m *Manager) strays(d Daemon) []linux.Process {
	if d.Mark == "" {
		return nil
	}
	return Strays(m.procRoot, d.Mark)
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
