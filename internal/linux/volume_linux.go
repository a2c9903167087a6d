package linux

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Lock takes an exclusive flock(2) on f, waiting until it is free or ctx
// ends. Locks taken through distinct opens of a file exclude each other,
// between processes and between goroutines of one process alike.
func Lock(ctx context.Context, f *os.File) error {
	wait := 200 * time.Microsecond
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			return &fs.PathError{Op: "flock", Path: f.Name(), Err: err}
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("flock %s: %w", f.Name(), context.Cause(ctx))
		case <-t.C:
		}
		wait = min(2*wait, 20*time.Millisecond)
	}
}

// Unlock releases a lock taken with [Lock].
func Unlock(f *os.File) error {
	if err := unix.Flock(int(f.Fd()), unix.LOCK_UN); err != nil {
		return &fs.PathError{Op: "flock", Path: f.Name(), Err: err}
	}
	return nil
}

// Noexec reports whether the file system holding path is mounted noexec.
func Noexec(path string) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false, &fs.PathError{Op: "statfs", Path: path, Err: err}
	}
	return st.Flags&unix.ST_NOEXEC != 0, nil
}

// MountTmpfs mounts a tmpfs on the directory path with the nosuid and nodev
// flags and the given root directory mode.
func MountTmpfs(path string, mode os.FileMode) error {
	if err := unix.Mount("tmpfs", path, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode="+octalMode(mode)); err != nil {
		return &fs.PathError{Op: "mount tmpfs", Path: path, Err: err}
	}
	return nil
}

// Unmount detaches the file system mounted on path.
func Unmount(path string) error {
	if err := unix.Unmount(path, 0); err != nil {
		return &fs.PathError{Op: "umount", Path: path, Err: err}
	}
	return nil
}

// Exchange swaps the paths a and b atomically (renameat2 RENAME_EXCHANGE).
// Both must exist. File systems without the operation give an error matching
// [ErrNotSupported].
func Exchange(a, b string) error {
	err := unix.Renameat2(unix.AT_FDCWD, a, unix.AT_FDCWD, b, unix.RENAME_EXCHANGE)
	if err == nil {
		return nil
	}
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EOPNOTSUPP) {
		err = fmt.Errorf("%w: %w", ErrNotSupported, err)
	}
	return &os.LinkError{Op: "exchange", Old: a, New: b, Err: err}
}

// Owner returns the user id owning the file fi describes.
func Owner(fi fs.FileInfo) (uint32, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return st.Uid, true
}

// Inode returns the device and inode numbers of the file fi describes, which
// tell whether two paths are hard links of one file.
func Inode(fi fs.FileInfo) (dev, ino uint64, ok bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, 0, false
	}
	return uint64(st.Dev), st.Ino, true
}
