package linux

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// PrivateDir makes dir, a directory of lock files or records, with mode
// 0700 when it is missing (its parent must exist), and checks it when it
// is not: a directory (not a symbolic link) owned by uid that no one else
// may write to. An existing one that others may read or search, as older
// releases made them (0755), is tightened to 0700 in place; one they may
// write to, one another user owns, or a link gives an [*UnsafeLockError]
// and is left as it is.
func PrivateDir(dir string, uid int) error {
	if err := unix.Mkdir(dir, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
		return &fs.PathError{Op: "mkdir", Path: dir, Err: err}
	}
	fd, st, err := openDir(dir, uid)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if st.Mode&0o7777 != 0o700 {
		if err := unix.Fchmod(fd, 0o700); err != nil {
			return &fs.PathError{Op: "chmod", Path: dir, Err: err}
		}
	}
	return nil
}

// openDir opens dir, which must be a directory owned by uid that neither
// group nor others may write to, without following a link.
func openDir(dir string, uid int) (int, *unix.Stat_t, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	switch {
	case errors.Is(err, unix.ELOOP):
		return -1, nil, &UnsafeLockError{Path: dir, Reason: "a symbolic link"}
	case errors.Is(err, unix.ENOTDIR):
		return -1, nil, &UnsafeLockError{Path: dir, Reason: "not a directory"}
	case err != nil:
		return -1, nil, &fs.PathError{Op: "open", Path: dir, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, nil, &fs.PathError{Op: "stat", Path: dir, Err: err}
	}
	if int(st.Uid) != uid {
		unix.Close(fd)
		return -1, nil, &UnsafeLockError{Path: dir, Reason: fmt.Sprintf("owned by uid %d, not %d", st.Uid, uid)}
	}
	if st.Mode&0o022 != 0 {
		unix.Close(fd)
		return -1, nil, &UnsafeLockError{Path: dir, Reason: fmt.Sprintf("writable by group or others (%v)", fs.FileMode(st.Mode&0o777))}
	}
	return fd, &st, nil
}

// OpenLockFile opens the lock file name of the directory dir for [Lock],
// creating it (mode 0600) when it is missing. dir must be a directory owned
// by uid that neither group nor others may write to (others may read it);
// the file must be a regular file owned by uid with no permission for group
// or others, so that no other user can open it, and so take its lock. No
// symbolic link is followed, and nothing but a regular file is opened.
// Anything else is an [*UnsafeLockError], and nothing is changed: a lock
// file that others could open may be open in a stranger's process, which
// would keep that open file (and its lock) whatever its mode became, so it
// is never taken over; whoever runs the programs removes it.
func OpenLockFile(dir, name string, uid int) (*os.File, error) {
	path := filepath.Join(dir, name)
	if name == "" || name != filepath.Base(name) || name == "." || name == ".." {
		return nil, &fs.PathError{Op: "open lock", Path: path, Err: fs.ErrInvalid}
	}
	dfd, _, err := openDir(dir, uid)
	if err != nil {
		return nil, err
	}
	defer unix.Close(dfd)
	for {
		fd, err := unix.Openat(dfd, name, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err == nil {
			return checkLockFile(fd, path, uid)
		}
		if !errors.Is(err, unix.EEXIST) {
			return nil, &fs.PathError{Op: "create", Path: path, Err: err}
		}
		var st unix.Stat_t
		if err := unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); errors.Is(err, unix.ENOENT) {
			continue // removed meanwhile
		} else if err != nil {
			return nil, &fs.PathError{Op: "stat", Path: path, Err: err}
		}
		if st.Mode&unix.S_IFMT != unix.S_IFREG {
			return nil, &UnsafeLockError{Path: path, Reason: fileKind(st.Mode)}
		}
		fd, err = unix.Openat(dfd, name, unix.O_RDWR|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		switch {
		case errors.Is(err, unix.ENOENT):
			continue
		case errors.Is(err, unix.ELOOP):
			return nil, &UnsafeLockError{Path: path, Reason: "a symbolic link"}
		case err != nil:
			return nil, &fs.PathError{Op: "open", Path: path, Err: err}
		}
		return checkLockFile(fd, path, uid)
	}
}

// checkLockFile checks the lock file open as fd and returns it as a file,
// or closes it.
func checkLockFile(fd int, path string, uid int) (*os.File, error) {
	var st unix.Stat_t
	err := unix.Fstat(fd, &st)
	switch {
	case err != nil:
		err = &fs.PathError{Op: "stat", Path: path, Err: err}
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		err = &UnsafeLockError{Path: path, Reason: fileKind(st.Mode)}
	case int(st.Uid) != uid:
		err = &UnsafeLockError{Path: path, Reason: fmt.Sprintf("owned by uid %d, not %d", st.Uid, uid)}
	case st.Mode&0o077 != 0:
		err = &UnsafeLockError{Path: path, Reason: fmt.Sprintf("open to group or others (%v)", fs.FileMode(st.Mode&0o777))}
	}
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), path), nil
}
