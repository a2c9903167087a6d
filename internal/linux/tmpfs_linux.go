package linux

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// MountSizedTmpfs mounts a tmpfs of its own at path, nosuid, nodev and
// noexec, of mode mode, holding at most size bytes (rounded up to whole
// pages by the kernel) and, when inodes is not 0, at most that many
// files. A write past size fails with ENOSPC. Its pages are memory,
// charged to the memory cgroup of the process that writes them, never the
// disk path lies on. path itself is not followed when it is a link.
func MountSizedTmpfs(path string, mode os.FileMode, size, inodes uint64) error {
	if size == 0 {
		return &fs.PathError{Op: "mount tmpfs", Path: path, Err: fmt.Errorf("size 0: %w", fs.ErrInvalid)}
	}
	fi, err := os.Lstat(path)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return &fs.PathError{Op: "mount tmpfs", Path: path, Err: fmt.Errorf("not a directory (%v): %w", fi.Mode().Type(), fs.ErrInvalid)}
	}
	data := "mode=" + octalMode(mode) + ",size=" + strconv.FormatUint(size, 10)
	if inodes > 0 {
		data += ",nr_inodes=" + strconv.FormatUint(inodes, 10)
	}
	if err := unix.Mount("tmpfs", path, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, data); err != nil {
		return &fs.PathError{Op: "mount tmpfs", Path: path, Err: err}
	}
	return nil
}

// IsMountPoint reports whether something is mounted on the directory
// path: its device differs from its parent's, or statx says it is a
// mount's root. A link at path is not followed (and is no mount point).
func IsMountPoint(path string) (bool, error) {
	var stx unix.Statx_t
	err := unix.Statx(unix.AT_FDCWD, path, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_TYPE, &stx)
	if err != nil {
		return false, &fs.PathError{Op: "statx", Path: path, Err: err}
	}
	if stx.Mode&unix.S_IFMT != unix.S_IFDIR {
		return false, nil
	}
	if stx.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT != 0 {
		return stx.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0, nil
	}
	var parent unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, filepath.Dir(path), 0, unix.STATX_TYPE, &parent); err != nil {
		return false, &fs.PathError{Op: "statx", Path: filepath.Dir(path), Err: err}
	}
	return stx.Dev_major != parent.Dev_major || stx.Dev_minor != parent.Dev_minor, nil
}

// UnmountAll detaches every file system mounted on path (MNT_DETACH: those
// a process still uses are freed when it lets go), without following a
// link at path. A path with nothing mounted on it, or none at all, is not
// an error.
func UnmountAll(path string) error {
	for range 64 {
		err := unix.Unmount(path, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
		switch {
		case err == nil:
			continue
		case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
			return nil // nothing (more) mounted there
		default:
			return &fs.PathError{Op: "umount", Path: path, Err: err}
		}
	}
	return &fs.PathError{Op: "umount", Path: path, Err: errors.New("still mounted after 64 unmounts")}
}

// FreeBytes is what the file system holding path has free for an
// unprivileged writer, and its size.
func FreeBytes(path string) (free, size uint64, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return 0, 0, &fs.PathError{Op: "statfs", Path: path, Err: err}
	}
	return st.Bavail * uint64(st.Bsize), st.Blocks * uint64(st.Bsize), nil
}
