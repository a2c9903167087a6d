package linux

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

	"github.com/gpuiso/gpuiso/node"
)

// ProcStat is what gpuiso reads of a process's /proc/<pid>/stat: its state
// (field 3: R, S, D, Z, X, ...) and its start time (field 22, clock ticks
// since boot), which tells it from a later process given the same pid.
type ProcStat struct {
	State byte
	Start uint64
}

// Exited reports whether the process has ended: a zombie or dead.
func (s ProcStat) Exited() bool { return s.State == 'Z' || s.State == 'X' }

// ParseProcStat reads the content of pid's stat file. The command name
// (field 2) may hold spaces and parentheses: fields are counted from the
// last ')'.
func ParseProcStat(pid int, b []byte) (ProcStat, error) {
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return ProcStat{}, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 || len(f[0]) != 1 {
		return ProcStat{}, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	start, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return ProcStat{}, fmt.Errorf("/proc/%d/stat: start time: %w", pid, err)
	}
	return ProcStat{State: f[0][0], Start: start}, nil
}

// ReadProcStat reads pid's stat file under the proc file system procRoot
// ("" means /proc). A process that does not exist gives an error matching
// fs.ErrNotExist.
func ReadProcStat(procRoot string, pid int) (ProcStat, error) {
	if procRoot == "" {
		procRoot = "/proc"
	}
	if pid <= 0 {
		return ProcStat{}, fmt.Errorf("pid %d: %w", pid, fs.ErrNotExist)
	}
	b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "stat"))
	if err != nil {
		return ProcStat{}, err
	}
	return ParseProcStat(pid, b)
}

// Process is node.Process, the module's one process identity: a pid and
// its start time, written "<pid>.<start>". This package answers what node
// cannot, as a pure package: whether a process still runs (Alive, Dead)
// and who the caller is (Self, ProcessOf).
type Process = node.Process

// ParseProcess reads "<pid>.<start>"; it is node.ParseProcess.
func ParseProcess(s string) (Process, error) { return node.ParseProcess(s) }

// ProcessOf names the running process pid, as the proc file system
// procRoot ("" means /proc) shows it. A process that does not exist gives
// an error matching fs.ErrNotExist.
func ProcessOf(procRoot string, pid int) (Process, error) {
	st, err := ReadProcStat(procRoot, pid)
	if err != nil {
		return Process{}, err
	}
	return Process{Pid: pid, Start: st.Start}, nil
}

// Self is the calling process, as procRoot shows it.
func Self(procRoot string) (Process, error) { return ProcessOf(procRoot, os.Getpid()) }

// Alive reports whether p still runs: its pid names a process started at
// p's start time that has not exited.
func Alive(procRoot string, p Process) bool {
	st, err := ReadProcStat(procRoot, p.Pid)
	return err == nil && st.Start == p.Start && !st.Exited()
}

// WaitGone polls until p no longer runs (Alive is false), at most bound
// and while ctx lasts; it reports whether p ended.
func WaitGone(ctx context.Context, procRoot string, p Process, bound time.Duration) bool {
	deadline := time.Now().Add(bound)
	wait := 200 * time.Microsecond
	for Alive(procRoot, p) {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(wait)
		wait = min(2*wait, 20*time.Millisecond)
	}
	return true
}

// End kills p (SIGKILL) while it is still the process it names (its pid
// and start time: never a later process given its pid) and waits for it
// to end, at most bound (WaitGone). A process that runs on is an error
// matching ErrStillRuns.
func End(ctx context.Context, procRoot string, p Process, bound time.Duration) error {
	if Alive(procRoot, p) {
		if err := Kill(p.Pid); err != nil {
			return fmt.Errorf("kill %d: %w", p.Pid, err)
		}
	}
	if !WaitGone(ctx, procRoot, p, bound) {
		return fmt.Errorf("process %d: %w", p.Pid, ErrStillRuns)
	}
	return nil
}

// PidGone reports whether no process of pid runs, whenever it started:
// the pid is gone or is a zombie. When procRoot cannot be read (the
// caller's own stat is not there), no pid is provably gone.
func PidGone(procRoot string, pid int) bool {
	if _, err := ReadProcStat(procRoot, os.Getpid()); err != nil {
		return false
	}
	st, err := ReadProcStat(procRoot, pid)
	if errors.Is(err, fs.ErrNotExist) {
		return true
	}
	return err == nil && st.Exited()
}

// Dead reports whether p provably ended: its pid is gone, is a zombie, or
// names a process started at another time. When procRoot cannot be read
// (the caller's own stat is not there), nothing is provably dead. A
// process is either Alive, Dead or neither (the proc file system cannot
// tell), never both.
func Dead(procRoot string, p Process) bool {
	if _, err := ReadProcStat(procRoot, os.Getpid()); err != nil {
		return false
	}
	st, err := ReadProcStat(procRoot, p.Pid)
	if errors.Is(err, fs.ErrNotExist) {
		return true
	}
	if err != nil {
		return false
	}
	return st.Start != p.Start || st.Exited()
}
