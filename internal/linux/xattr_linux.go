package linux

import (
	"errors"
	"io/fs"

	"golang.org/x/sys/unix"
)

// BPF program attach flags.
const (
	BPFFAllowMulti = unix.BPF_F_ALLOW_MULTI
)

// ErrNoXattr is returned by GetXattr when the attribute is not set.
var ErrNoXattr = errors.New("no such extended attribute")

// SetXattr sets an extended attribute of path.
func SetXattr(path, name string, value []byte) error {
	if err := unix.Setxattr(path, name, value, 0); err != nil {
		return &fs.PathError{Op: "setxattr " + name, Path: path, Err: err}
	}
	return nil
}

// GetXattr reads an extended attribute of path.
func GetXattr(path, name string) ([]byte, error) {
	buf := make([]byte, 4096)
	for {
		n, err := unix.Getxattr(path, name, buf)
		switch {
		case errors.Is(err, unix.ERANGE):
			buf = make([]byte, 2*len(buf))
			continue
		case errors.Is(err, unix.ENODATA):
			return nil, &fs.PathError{Op: "getxattr " + name, Path: path, Err: ErrNoXattr}
		case err != nil:
			return nil, &fs.PathError{Op: "getxattr " + name, Path: path, Err: err}
		}
		return buf[:n], nil
	}
}
