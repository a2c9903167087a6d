package linux

import (
	"errors"
	"os"
	"os/exec"
	"syscall"
)

// Unreachable reports whether err says that a peer over a socket could not
// be reached or dropped the connection: the socket is missing, refused,
// reset, or its pipe broke.
func Unreachable(err error) bool {
	for _, e := range []syscall.Errno{syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.ENOENT, syscall.EPIPE} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// Busy reports whether err says that the thing is in use (EBUSY).
func Busy(err error) bool { return errors.Is(err, syscall.EBUSY) }

// Invalid reports whether err is EINVAL: for a mount, that the path is no
// longer a mount point.
func Invalid(err error) bool { return errors.Is(err, syscall.EINVAL) }

// NotEmpty reports whether err is ENOTEMPTY (or EEXIST, which rename(2)
// may return for the same): a directory is in the way.
func NotEmpty(err error) bool {
	return errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST)
}

// SignalKill is SIGKILL's number: a process it killed exits 128+SignalKill
// as shells report it.
const SignalKill = int(syscall.SIGKILL)

// ForwardedSignals are the signals a container's init passes on to its
// command.
func ForwardedSignals() []os.Signal {
	return []os.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2}
}

// ExitCode is how a started command ended as shells report it: its exit
// status, or 128+N when signal N killed it. err is what Wait returned.
func ExitCode(err error) (int, bool) {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return 0, err == nil
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal()), true
	}
	return ee.ExitCode(), true
}

// UserAttr runs a command as uid:gid with no supplementary groups.
func UserAttr(uid, gid uint32) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid, Groups: []uint32{}}}
}

// Loop reports whether err is ELOOP: too many symbolic links.
func Loop(err error) bool { return errors.Is(err, syscall.ELOOP) }
