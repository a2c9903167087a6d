package linux

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"

	pathrs "github.com/cyphar/filepath-securejoin/pathrs-lite"
	"golang.org/x/sys/unix"
)

// OpenFileInRoot opens the file name of the directory root for reading, as
// a process whose root is root would find it: symbolic links on the way are
// followed inside root (an absolute link or ".." never leads out of it, as
// openat2's RESOLVE_IN_ROOT resolves them), and a link in the last
// component is not followed. Only a regular file is opened: its kind is
// checked on an O_PATH handle, which runs no driver's open and waits on no
// FIFO, and that very file is then reopened read-only with O_NONBLOCK. Any
// other kind of file gives an error matching [ErrNotRegular].
//
// It is how gpuiso reads a file of an image's root file system on the host
// as root: nothing the image holds reaches a host path, a device or a pipe.
func OpenFileInRoot(root, name string) (*os.File, error) {
	clean := path.Clean("/" + name)
	dir, base := path.Split(clean)
	if base == "" {
		return nil, &fs.PathError{Op: "open in root", Path: name, Err: fmt.Errorf("the root itself: %w", ErrNotRegular)}
	}
	d, err := pathrs.OpenInRoot(root, dir)
	if err != nil {
		return nil, &fs.PathError{Op: "open in root", Path: name, Err: err}
	}
	defer d.Close()
	fd, err := unix.Openat(int(d.Fd()), base, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open in root", Path: name, Err: err}
	}
	h := os.NewFile(uintptr(fd), clean)
	defer h.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, &fs.PathError{Op: "stat in root", Path: name, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, &fs.PathError{Op: "open in root", Path: name, Err: fmt.Errorf("%s: %w", fileKind(st.Mode), ErrNotRegular)}
	}
	f, err := pathrs.Reopen(h, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC)
	if err != nil {
		return nil, &fs.PathError{Op: "reopen in root", Path: name, Err: err}
	}
	return f, nil
}

// ReadDirInRoot lists the directory name of root, found as OpenFileInRoot
// finds a file's directory (every link followed inside root, the last one
// too): at most max entries (all for max <= 0), in directory order, with
// their kinds as the directory reports them. Nothing but the directory is
// opened.
func ReadDirInRoot(root, name string, max int) ([]fs.DirEntry, error) {
	h, err := pathrs.OpenInRoot(root, path.Clean("/"+name))
	if err != nil {
		return nil, &fs.PathError{Op: "open in root", Path: name, Err: err}
	}
	defer h.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(h.Fd()), &st); err != nil {
		return nil, &fs.PathError{Op: "stat in root", Path: name, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return nil, &fs.PathError{Op: "read dir in root", Path: name, Err: fmt.Errorf("%s: %w", fileKind(st.Mode), ErrNotDirectory)}
	}
	d, err := pathrs.Reopen(h, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NONBLOCK|unix.O_CLOEXEC)
	if err != nil {
		return nil, &fs.PathError{Op: "reopen in root", Path: name, Err: err}
	}
	defer d.Close()
	if max <= 0 {
		max = -1
	}
	entries, err := d.ReadDir(max)
	if err != nil && !errors.Is(err, io.EOF) { // io.EOF: an empty directory read in parts
		return nil, &fs.PathError{Op: "read dir in root", Path: name, Err: err}
	}
	return entries, nil
}

// fileKind names the kind of file a stat mode describes.
func fileKind(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFIFO:
		return "a FIFO"
	case unix.S_IFCHR:
		return "a character device"
	case unix.S_IFBLK:
		return "a block device"
	case unix.S_IFSOCK:
		return "a socket"
	case unix.S_IFLNK:
		return "a symbolic link"
	case unix.S_IFDIR:
		return "a directory"
	case unix.S_IFREG:
		return "a regular file"
	}
	return fmt.Sprintf("a file of mode %#o", mode&unix.S_IFMT)
}
