package linux

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// OpenSocketPath opens the UNIX socket file name of the directory dir as
// an O_PATH handle, without following a link in name: a process reaches
// that very socket through the handle (connect(2) to
// /proc/self/fd/N), whatever is put at its path afterwards. Anything but a
// socket there (a link, a file) is not opened and gives an error matching
// ErrNotSocket; a missing one fs.ErrNotExist.
func OpenSocketPath(dir, name string) (*os.File, error) {
	path := filepath.Join(dir, name)
	if name == "" || name != filepath.Base(name) || name == "." || name == ".." {
		return nil, &fs.PathError{Op: "open socket", Path: path, Err: fs.ErrInvalid}
	}
	d, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(d)
	fd, err := unix.Openat(d, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open socket", Path: path, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, &fs.PathError{Op: "stat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		unix.Close(fd)
		return nil, &fs.PathError{Op: "open socket", Path: path, Err: fmt.Errorf("%s: %w", fileKind(st.Mode), ErrNotSocket)}
	}
	return os.NewFile(uintptr(fd), path), nil
}
