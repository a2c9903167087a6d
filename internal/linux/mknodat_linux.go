package linux

import (
	"io/fs"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// MknodAt makes the device node name, one path component, in the open
// directory dir, with exactly the permissions perm: the node lands in that
// very directory, whatever links lead to it now. It is how a tree opened
// in-root (an [os.Root]) gets its device nodes.
func MknodAt(dir *os.File, name string, perm os.FileMode, dev DeviceNumber) error {
	if name == "" || name == "." || name == ".." || strings.ContainsRune(name, '/') {
		return &fs.PathError{Op: "mknodat", Path: name, Err: unix.EINVAL}
	}
	mode := uint32(perm.Perm())
	if dev.Char {
		mode |= unix.S_IFCHR
	} else {
		mode |= unix.S_IFBLK
	}
	fd := int(dir.Fd())
	if err := unix.Mknodat(fd, name, mode, int(unix.Mkdev(dev.Major, dev.Minor))); err != nil {
		return &fs.PathError{Op: "mknodat", Path: name, Err: err}
	}
	// mknodat honours the umask; make the permissions exactly what was
	// asked, on the node just made (a link is never made by it).
	if err := unix.Fchmodat(fd, name, mode&0o7777, 0); err != nil {
		return &fs.PathError{Op: "chmod", Path: name, Err: err}
	}
	return nil
}
