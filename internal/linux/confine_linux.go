package linux

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Clone flags of the namespaces a confined container's init is born in.
const (
	CloneNewPID    = unix.CLONE_NEWPID
	CloneNewCgroup = unix.CLONE_NEWCGROUP
	CloneNewNet    = unix.CLONE_NEWNET
	CloneNewIPC    = unix.CLONE_NEWIPC
	CloneNewUTS    = unix.CLONE_NEWUTS
)

// UnshareCgroup moves the calling thread into a new cgroup namespace rooted
// at the cgroups the thread is in now. Only the calling thread moves: lock
// it (runtime.LockOSThread) and start the container's command from it.
func UnshareCgroup() error {
	if err := unix.Unshare(unix.CLONE_NEWCGROUP); err != nil {
		return fmt.Errorf("unshare cgroup namespace: %w", err)
	}
	return nil
}

// lastCapability is the highest capability the running kernel knows.
func lastCapability() int {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			return n
		}
	}
	return unix.CAP_LAST_CAP
}

// LimitCapabilities reduces the calling thread's capabilities to keep (a
// list of capability numbers): every other capability leaves the bounding
// set, the effective and permitted sets become keep, the inheritable and
// ambient sets become empty. A root program the thread then executes gets
// exactly keep; any other program gets none. Capability sets belong to a
// thread: lock it and start the command from it.
func LimitCapabilities(keep []int) error {
	last := lastCapability()
	var want [2]uint32
	for _, c := range keep {
		if c < 0 || c > last {
			return fmt.Errorf("capability %d: %w", c, ErrUnknownCapability)
		}
		want[c/32] |= 1 << (c % 32)
	}
	for c := 0; c <= last; c++ {
		if want[c/32]&(1<<(c%32)) != 0 {
			continue
		}
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil {
			return fmt.Errorf("drop capability %d from the bounding set: %w", c, err)
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("clear ambient capabilities: %w", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	data := [2]unix.CapUserData{{Effective: want[0], Permitted: want[0]}, {Effective: want[1], Permitted: want[1]}}
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("set capabilities: %w", err)
	}
	return nil
}

// SetNoNewPrivs sets the calling thread's no_new_privs bit: no program it
// executes gains privileges (setuid bits, file capabilities). Children
// inherit it; it cannot be cleared.
func SetNoNewPrivs() error {
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("set no_new_privs: %w", err)
	}
	return nil
}

// PivotRoot makes newRoot (a mount point) the root of the mount namespace
// and detaches the old root, so that nothing of the host's file system stays
// reachable. The calling process must be alone in a private mount namespace.
func PivotRoot(newRoot string) error {
	if err := unix.Chdir(newRoot); err != nil {
		return &fs.PathError{Op: "chdir", Path: newRoot, Err: err}
	}
	// pivot_root(".", "."): the old root ends up mounted over the new one,
	// where it is detached at once.
	if err := unix.PivotRoot(".", "."); err != nil {
		return &fs.PathError{Op: "pivot_root", Path: newRoot, Err: err}
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return &fs.PathError{Op: "unmount old root", Path: newRoot, Err: err}
	}
	if err := unix.Chdir("/"); err != nil {
		return &fs.PathError{Op: "chdir", Path: "/", Err: err}
	}
	return nil
}

// MountProc mounts a proc file system (of the calling process's pid
// namespace) at path, nosuid, nodev and noexec.
func MountProc(path string) error {
	if err := unix.Mount("proc", path, "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return &fs.PathError{Op: "mount proc", Path: path, Err: err}
	}
	return nil
}

// MountSysfs mounts a read-only sysfs at path, nosuid, nodev and noexec.
// Over the host's own /sys (the kernel refuses the same sysfs twice on one
// mount point) it binds /sys there without its submounts, read-only.
func MountSysfs(path string) error {
	const flags = unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
	err := unix.Mount("sysfs", path, "sysfs", flags, "")
	if errors.Is(err, unix.EBUSY) {
		if err = unix.Mount("/sys", path, "", unix.MS_BIND, ""); err == nil {
			err = unix.Mount("", path, "", unix.MS_REMOUNT|unix.MS_BIND|flags, "")
		}
	}
	if err != nil {
		return &fs.PathError{Op: "mount sysfs", Path: path, Err: err}
	}
	return nil
}

// MountCgroup mounts a read-only cgroup file system at path, as the calling
// thread's cgroup namespace shows it: cgroup2 when controller is "", else
// the cgroup v1 hierarchy of that controller.
func MountCgroup(path, controller string) error {
	flags := uintptr(unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC)
	var err error
	if controller == "" {
		err = unix.Mount("cgroup2", path, "cgroup2", flags, "")
	} else {
		err = unix.Mount("cgroup", path, "cgroup", flags, controller)
	}
	if err != nil {
		return &fs.PathError{Op: "mount cgroup " + controller, Path: path, Err: err}
	}
	return nil
}

// RemountReadOnly makes the mount at path read-only, nosuid and nodev,
// keeping its other flags.
func RemountReadOnly(path string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return &fs.PathError{Op: "statfs", Path: path, Err: err}
	}
	flags := uintptr(unix.MS_REMOUNT | unix.MS_BIND | unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV)
	if st.Flags&unix.ST_NOEXEC != 0 {
		flags |= unix.MS_NOEXEC
	}
	if err := unix.Mount("", path, "", flags, ""); err != nil {
		return &fs.PathError{Op: "remount read-only", Path: path, Err: err}
	}
	return nil
}

// MaskPath hides path: a directory gets an empty read-only tmpfs over it, a
// file the node null (a path to /dev/null) bound over it. A path that does
// not exist is left alone.
func MaskPath(path, null string) error {
	fi, err := os.Stat(path)
	if err != nil {
		if os.IsNotExist(err) {
			return nil
		}
		return err
	}
	if fi.IsDir() {
		err = unix.Mount("tmpfs", path, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=0")
	} else {
		err = unix.Mount(null, path, "", unix.MS_BIND, "")
	}
	if err != nil {
		return &fs.PathError{Op: "mask", Path: path, Err: err}
	}
	return nil
}

// LoadSeccomp installs prog as a seccomp filter of the calling thread only
// (no TSYNC); no_new_privs must be set first (SetNoNewPrivs).
func LoadSeccomp(prog []SeccompInstruction) error {
	if len(prog) == 0 {
		return fmt.Errorf("seccomp: empty program: %w", ErrNotSupported)
	}
	filter := make([]unix.SockFilter, len(prog))
	for i, in := range prog {
		filter[i] = unix.SockFilter{Code: in.Op, Jt: in.Jt, Jf: in.Jf, K: in.K}
	}
	fprog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	if _, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&fprog))); errno != 0 {
		return fmt.Errorf("seccomp: load filter: %w", errno)
	}
	return nil
}

// InitAttr is how a container's init is started: in a session of its own,
// born in the namespaces of cloneflags.
func InitAttr(cloneflags uintptr) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Cloneflags: cloneflags, Setsid: true}
}
