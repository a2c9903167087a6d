package linux

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"
)

// NamespaceMount is a mount made in the mount namespace of a process that
// StartDaemon starts, before it starts: Source (a host directory) bound at
// Target, or, with Source empty, a tmpfs of mode Mode at Target. Target
// is made when missing (in a tmpfs mounted before it, say).
//
// Content, instead, is a file whose bytes are written at Target, a new
// file of mode Mode owned by the starter, after the mounts before it (a
// tmpfs): a copy of a program that exists in the daemon's namespace
// alone. It is read from the start of the file, in the starter's
// namespace, wherever it was opened.
//
// Untrusted marks a bound directory that another party may write while
// the daemon runs (a container's, say): it is bound nosuid, nodev, noexec
// and nosymfollow, so that the daemon, however privileged, follows no
// link planted there to a file of the host's. A kernel without
// nosymfollow (before Linux 5.10) fails the start with an error matching
// ErrNotSupported, before anything runs.
type NamespaceMount struct {
	Source    string
	Target    string
	Mode      os.FileMode
	Untrusted bool
	Content   *os.File
}

// StartDaemon starts cmd as a daemon: in a session of its own (so that
// the signals of its starter's terminal do not reach it) and, with mounts,
// in a mount namespace of its own in which those mounts are made, seen by
// it and its children alone (the host's mounts still reach it). The
// namespace is made on a thread of its own, locked and then ended, which
// forks the process: the rest of the caller keeps its own.
func StartDaemon(cmd *exec.Cmd, mounts []NamespaceMount) error {
	return StartDaemonFrom(cmd, "", mounts)
}

// StartDaemonFrom is StartDaemon with the daemon's mount namespace made
// from the namespace nsFile names (/proc/<pid>/ns/mnt) instead of the
// caller's: cmd's path, its directory and the mounts' sources are then
// paths of that namespace. It is for a caller whose own namespace ends
// before the daemon should (a container's): a daemon's namespace made
// from it holds the container's mounts, which the container's removal
// detaches from under the daemon (a directory removed on the node takes
// every mount on it, in every namespace, with it). "" is the caller's own.
func StartDaemonFrom(cmd *exec.Cmd, nsFile string, mounts []NamespaceMount) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setsid = true
	if len(mounts) == 0 && nsFile == "" {
		return cmd.Start()
	}
	return onSpareThread(func() (bool, error) {
		if nsFile != "" {
			if err := joinMountNamespace(nsFile); err != nil {
				return true, err
			}
		}
		if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
			return false, &fs.PathError{Op: "unshare mount namespace", Path: "/", Err: err}
		}
		return true, startIn(cmd, mounts)
	})
}

// joinMountNamespace moves the calling thread into the mount namespace
// nsFile: its file system attributes (root, working directory) become its
// own first, as the kernel asks of a thread that changes namespace.
func joinMountNamespace(nsFile string) error {
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		return &fs.PathError{Op: "unshare file system attributes", Path: nsFile, Err: err}
	}
	fd, err := unix.Open(nsFile, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &fs.PathError{Op: "open", Path: nsFile, Err: err}
	}
	defer unix.Close(fd)
	if err := unix.Setns(fd, unix.CLONE_NEWNS); err != nil {
		return &fs.PathError{Op: "join mount namespace", Path: nsFile, Err: err}
	}
	return nil
}

// onSpareThread runs fn on a locked thread other than the process's main
// thread, whose namespaces /proc/self shows for the whole process. When fn
// reports that it changed the thread (taint), the thread is never
// unlocked: it ends with its goroutine.
func onSpareThread(fn func() (taint bool, err error)) error {
	ch := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if unix.Gettid() == unix.Getpid() {
			// Hold the main thread meanwhile, so that the work lands on
			// another one.
			ch <- onSpareThread(fn)
			runtime.UnlockOSThread()
			return
		}
		taint, err := fn()
		if !taint {
			runtime.UnlockOSThread()
		}
		ch <- err
	}()
	return <-ch
}

// stNoSymfollow is statfs's flag of a nosymfollow mount (ST_NOSYMFOLLOW,
// Linux 5.10).
const stNoSymfollow = 0x2000

// untrustedFlags are the flags of an Untrusted mount.
const untrustedFlags = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC | unix.MS_NOSYMFOLLOW

func startIn(cmd *exec.Cmd, mounts []NamespaceMount) error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return &fs.PathError{Op: "make rslave", Path: "/", Err: err}
	}
	// Every source is opened first: a tmpfs mounted on the way may cover
	// the path of a later mount's source.
	srcs := make([]*os.File, len(mounts))
	defer func() {
		for _, f := range srcs {
			if f != nil {
				f.Close()
			}
		}
	}()
	for i, m := range mounts {
		if m.Source == "" {
			continue
		}
		f, err := os.OpenFile(m.Source, unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		srcs[i] = f
	}
	for i, m := range mounts {
		if m.Content != nil {
			if err := copyContent(m); err != nil {
				return err
			}
			continue
		}
		if err := os.MkdirAll(m.Target, 0o755); err != nil {
			return err
		}
		if m.Source == "" {
			if err := MountTmpfs(m.Target, m.Mode); err != nil {
				return err
			}
			continue
		}
		if err := unix.Mount(fdPath(srcs[i]), m.Target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return &fs.PathError{Op: "bind " + m.Source, Path: m.Target, Err: err}
		}
		if m.Untrusted {
			if err := unix.Mount("", m.Target, "", unix.MS_BIND|unix.MS_REMOUNT|untrustedFlags, ""); err != nil {
				err = &fs.PathError{Op: "remount nosuid,nodev,noexec,nosymfollow", Path: m.Target, Err: err}
				if errors.Is(err, unix.EINVAL) {
					return fmt.Errorf("%w: %w", err, ErrNotSupported)
				}
				return err
			}
			// A kernel before nosymfollow ignores the flag it does not
			// know: what the mount has is read back.
			var st unix.Statfs_t
			if err := unix.Statfs(m.Target, &st); err != nil {
				return &fs.PathError{Op: "statfs", Path: m.Target, Err: err}
			}
			if uint64(st.Flags)&stNoSymfollow == 0 {
				return fmt.Errorf("%s: the kernel did not make the mount nosymfollow: %w", m.Target, ErrNotSupported)
			}
		}
	}
	return cmd.Start()
}

// copyContent writes m.Content's bytes at m.Target, a new file of mode
// m.Mode, its directory made when missing.
func copyContent(m NamespaceMount) error {
	fi, err := m.Content.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return &fs.PathError{Op: "copy", Path: m.Content.Name(), Err: ErrNotRegular}
	}
	if err := os.MkdirAll(filepath.Dir(m.Target), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(m.Target, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, io.NewSectionReader(m.Content, 0, fi.Size()))
	if err == nil {
		err = f.Chmod(m.Mode.Perm())
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("copy %s to %s: %w", m.Content.Name(), m.Target, err)
	}
	return nil
}

// LockHolder returns the pid of the process that holds a POSIX (fcntl)
// lock on the file path, as F_GETLK reports it in the caller's pid
// namespace: 0 when none does. A lock held by the caller itself is not
// seen. Only a regular file is opened, as OpenFileInRoot opens one (a link
// in its last component is not followed, and a FIFO or a device is
// ErrNotRegular, never opened): path may be in a directory that a
// container can write, such as an MPS daemon's pipe directory.
func LockHolder(path string) (int, error) {
	f, err := OpenFileInRoot(filepath.Dir(path), filepath.Base(path))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: 0, Len: 0}
	if err := unix.FcntlFlock(f.Fd(), unix.F_GETLK, &lk); err != nil {
		return 0, &fs.PathError{Op: "fcntl F_GETLK", Path: path, Err: err}
	}
	if lk.Type == unix.F_UNLCK {
		return 0, nil
	}
	return int(lk.Pid), nil
}

// Signal sends sig (a signal number) to pid. A process that is gone is
// fs.ErrNotExist.
func Signal(pid, sig int) error {
	if pid <= 0 {
		return fmt.Errorf("signal pid %d: %w", pid, fs.ErrNotExist)
	}
	err := unix.Kill(pid, unix.Signal(sig))
	if errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("signal pid %d: %w", pid, fs.ErrNotExist)
	}
	return err
}

// Signals Signal sends.
const (
	SignalTerm = int(unix.SIGTERM)
)
