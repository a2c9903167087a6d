package linux

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

	"golang.org/x/sys/unix"
)

// StatDevice reads the device number of the node at path without following a
// final symlink. It returns an error wrapping [fs.ErrInvalid] when path is not
// a device node.
func StatDevice(path string) (DeviceNumber, error) {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return DeviceNumber{}, &fs.PathError{Op: "lstat", Path: path, Err: err}
	}
	return deviceNumber(path, &st)
}

// deviceNumber is the device number of path, whose stat is st, a device
// node; anything else is an error.
func deviceNumber(path string, st *unix.Stat_t) (DeviceNumber, error) {
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFCHR, unix.S_IFBLK:
	default:
		return DeviceNumber{}, &fs.PathError{Op: "stat", Path: path, Err: fmt.Errorf("not a device node: %w", fs.ErrInvalid)}
	}
	return DeviceNumber{
		Char:  st.Mode&unix.S_IFMT == unix.S_IFCHR,
		Major: unix.Major(uint64(st.Rdev)),
		Minor: unix.Minor(uint64(st.Rdev)),
	}, nil
}

// Mknod creates a device node at path with the given permissions.
func Mknod(path string, perm os.FileMode, dev DeviceNumber) error {
	mode := uint32(perm.Perm())
	if dev.Char {
		mode |= unix.S_IFCHR
	} else {
		mode |= unix.S_IFBLK
	}
	if err := unix.Mknod(path, mode, int(unix.Mkdev(dev.Major, dev.Minor))); err != nil {
		return &fs.PathError{Op: "mknod", Path: path, Err: err}
	}
	// mknod honours the umask; make the permissions exactly what was asked.
	if err := unix.Chmod(path, mode&0o7777); err != nil {
		return &fs.PathError{Op: "chmod", Path: path, Err: err}
	}
	return nil
}

// FilesystemType returns the magic number of the file system holding path.
func FilesystemType(path string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return 0, &fs.PathError{Op: "statfs", Path: path, Err: err}
	}
	return int64(st.Type), nil
}

// IsRoot reports whether the process runs with an effective user id of 0.
func IsRoot() bool { return unix.Geteuid() == 0 }

// Kill sends SIGKILL to pid; a process already gone is not an error.
func Kill(pid int) error {
	if err := unix.Kill(pid, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
		return err
	}
	return nil
}
