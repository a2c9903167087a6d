package linux

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	securejoin "github.com/cyphar/filepath-securejoin"
	pathrs "github.com/cyphar/filepath-securejoin/pathrs-lite"
	"golang.org/x/sys/unix"
)

// Root is a directory that paths are resolved inside of, as if it were the
// root of the file system: a symbolic link in it, absolute or with "..",
// never leads out of it. It is how a container's mount points are made in a
// root file system that came from an image: an image may hold any link,
// and nothing the set-up creates or mounts may land on the host.
type Root struct {
	f    *os.File
	path string
}

// OpenRoot opens the directory path as a Root.
func OpenRoot(path string) (*Root, error) {
	f, err := os.OpenFile(path, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	return &Root{f: f, path: path}, nil
}

// Close closes the root.
func (r *Root) Close() error { return r.f.Close() }

// target opens dest inside the root for mounting on: a directory, made (with
// its parents) when missing, or, when file is set, a file, made empty when
// missing. Every component is resolved inside the root.
func (r *Root) target(dest string, file bool) (*os.File, error) {
	// Links are followed inside the root first, as the container will
	// follow them once the root is its own (a dangling link to /x leads to
	// the root's /x); what is made is then made race-free, no component
	// resolved outside the root.
	joined, err := securejoin.SecureJoin(r.path, dest)
	if err != nil {
		return nil, &fs.PathError{Op: "mount point", Path: dest, Err: err}
	}
	dest, err = filepath.Rel(r.path, joined)
	if err != nil {
		return nil, &fs.PathError{Op: "mount point", Path: dest, Err: err}
	}
	if !file {
		f, err := pathrs.MkdirAllHandle(r.f, dest, 0o755)
		if err != nil {
			return nil, &fs.PathError{Op: "mount point", Path: dest, Err: err}
		}
		return f, nil
	}
	parent, err := pathrs.MkdirAllHandle(r.f, filepath.Dir(filepath.Clean("/"+dest)), 0o755)
	if err != nil {
		return nil, &fs.PathError{Op: "mount point", Path: dest, Err: err}
	}
	defer parent.Close()
	base := filepath.Base(dest)
	fd, err := unix.Openat(int(parent.Fd()), base, unix.O_CREAT|unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return nil, &fs.PathError{Op: "mount point", Path: dest, Err: err}
	}
	return os.NewFile(uintptr(fd), filepath.Join(r.path, dest)), nil
}

// fdPath names an open file by its /proc/self/fd link: mount(2) given that
// path acts on the very file the descriptor holds, wherever it is now.
func fdPath(f *os.File) string { return fmt.Sprintf("/proc/self/fd/%d", f.Fd()) }

// Bind binds src (recursively) at dest inside the root; with readOnly the
// whole bound tree is read-only, nosuid and nodev from the moment it is
// attached. src is a host path; a file is bound on a file.
func (r *Root) Bind(src, dest string, readOnly bool) error {
	return r.BindWith(src, dest, BindOptions{ReadOnly: readOnly})
}

// BindOptions are the flags of a bind mount, each applied to the whole
// bound tree from the moment it is attached.
type BindOptions struct {
	// ReadOnly makes it read-only, nosuid and nodev.
	ReadOnly bool
	// NoSuid, NoDev and NoExec are the mount options of those names.
	NoSuid, NoDev, NoExec bool
}

// ParseBindOptions reads the flags BindOptions holds from an OCI mount's
// options ("ro", "nosuid", "nodev", "noexec"); the others are ignored.
func ParseBindOptions(options []string) BindOptions {
	var o BindOptions
	for _, opt := range options {
		switch opt {
		case "ro":
			o.ReadOnly = true
		case "nosuid":
			o.NoSuid = true
		case "nodev":
			o.NoDev = true
		case "noexec":
			o.NoExec = true
		}
	}
	return o
}

// attr is o as mount_setattr's attributes.
func (o BindOptions) attr() uint64 {
	var a uint64
	if o.ReadOnly {
		a |= unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV
	}
	if o.NoSuid {
		a |= unix.MOUNT_ATTR_NOSUID
	}
	if o.NoDev {
		a |= unix.MOUNT_ATTR_NODEV
	}
	if o.NoExec {
		a |= unix.MOUNT_ATTR_NOEXEC
	}
	return a
}

// flags is o as mount(2)'s flags of a remount.
func (o BindOptions) flags() uintptr {
	var f uintptr
	if o.ReadOnly {
		f |= unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV
	}
	if o.NoSuid {
		f |= unix.MS_NOSUID
	}
	if o.NoDev {
		f |= unix.MS_NODEV
	}
	if o.NoExec {
		f |= unix.MS_NOEXEC
	}
	return f
}

// BindWith binds src (recursively) at dest inside the root, as Bind does,
// with the flags o.
func (r *Root) BindWith(src, dest string, o BindOptions) error {
	fi, err := os.Stat(src)
	if err != nil {
		return err
	}
	t, err := r.target(dest, !fi.IsDir())
	if err != nil {
		return err
	}
	defer t.Close()
	if err := bindDetached(src, t, o.attr()); !errors.Is(err, unix.ENOSYS) {
		return err
	}
	// Kernels before the new mount API (5.12): bind, then remount the
	// bind, found by the path the kernel reports for the target.
	if err := unix.Mount(src, fdPath(t), "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return &fs.PathError{Op: "bind mount " + src, Path: dest, Err: err}
	}
	if o.flags() == 0 {
		return nil
	}
	at, err := os.Readlink(fdPath(t))
	if err != nil {
		return err
	}
	if err := unix.Mount("", at, "", unix.MS_BIND|unix.MS_REMOUNT|o.flags(), ""); err != nil {
		return &fs.PathError{Op: "remount with flags", Path: dest, Err: err}
	}
	return nil
}

// bindDetached clones src's mount tree, gives it the mount attributes attr
// while no one can see it yet, and attaches it on t. It fails with ENOSYS
// where the kernel lacks the new mount API.
func bindDetached(src string, t *os.File, attr uint64) error {
	tree, err := unix.OpenTree(unix.AT_FDCWD, src, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
	if err != nil {
		if errors.Is(err, unix.ENOSYS) {
			return err
		}
		return &fs.PathError{Op: "clone mount", Path: src, Err: err}
	}
	defer unix.Close(tree)
	if attr != 0 {
		ma := unix.MountAttr{Attr_set: attr}
		if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &ma); err != nil {
			if errors.Is(err, unix.ENOSYS) {
				return err
			}
			return &fs.PathError{Op: "set mount flags", Path: src, Err: err}
		}
	}
	if err := unix.MoveMount(tree, "", int(t.Fd()), "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil {
		return &fs.PathError{Op: "attach mount of " + src, Path: t.Name(), Err: err}
	}
	return nil
}

// Tmpfs mounts a private tmpfs (nosuid, nodev) at dest inside the root, its
// top directory with mode.
func (r *Root) Tmpfs(dest string, mode os.FileMode) error {
	t, err := r.target(dest, false)
	if err != nil {
		return err
	}
	defer t.Close()
	if err := unix.Mount("tmpfs", fdPath(t), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode="+octalMode(mode)); err != nil {
		return &fs.PathError{Op: "mount tmpfs", Path: dest, Err: err}
	}
	return nil
}

// StatDevice is the device number of the device node dest inside the
// root, links followed inside it; anything else is an error.
func (r *Root) StatDevice(dest string) (DeviceNumber, error) {
	f, err := pathrs.OpenatInRoot(r.f, dest)
	if err != nil {
		return DeviceNumber{}, &fs.PathError{Op: "open in root", Path: dest, Err: err}
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return DeviceNumber{}, &fs.PathError{Op: "stat", Path: dest, Err: err}
	}
	return deviceNumber(dest, &st)
}

// Unbind detaches what is mounted on dest inside the root and removes
// dest. dest is found as Bind finds it, links followed inside the root:
// neither the unmount nor the removal reaches anything outside it. A dest
// that is not there is not an error.
func (r *Root) Unbind(dest string) error {
	joined, err := securejoin.SecureJoin(r.path, dest)
	if err != nil {
		return &fs.PathError{Op: "unbind", Path: dest, Err: err}
	}
	clean, err := filepath.Rel(r.path, joined)
	if err != nil {
		return &fs.PathError{Op: "unbind", Path: dest, Err: err}
	}
	clean = filepath.Clean("/" + clean)
	parent, err := pathrs.OpenatInRoot(r.f, filepath.Dir(clean))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return &fs.PathError{Op: "unbind", Path: dest, Err: err}
	}
	defer parent.Close()
	base := filepath.Base(clean)
	fd, err := unix.Openat(int(parent.Fd()), base, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return &fs.PathError{Op: "unbind", Path: dest, Err: err}
	}
	f := os.NewFile(uintptr(fd), filepath.Join(r.path, clean))
	err = unix.Unmount(fdPath(f), unix.MNT_DETACH)
	f.Close()
	if err != nil && !errors.Is(err, unix.EINVAL) { // EINVAL: nothing mounted there
		return &fs.PathError{Op: "unmount", Path: dest, Err: err}
	}
	if err := unix.Unlinkat(int(parent.Fd()), base, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return &fs.PathError{Op: "remove", Path: dest, Err: err}
	}
	return nil
}

// Dir makes sure dest is a directory of the root itself, not a link: the
// places the set-up later reaches by plain paths (/dev, /proc, /sys) must
// not lead anywhere else. A missing one is made.
func (r *Root) Dir(dest string) error {
	p := filepath.Join(r.path, dest)
	fi, err := os.Lstat(p)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := unix.Mkdirat(int(r.f.Fd()), filepath.Clean("./"+dest), 0o755); err != nil {
			return &fs.PathError{Op: "mkdir", Path: p, Err: err}
		}
		return nil
	case err != nil:
		return err
	case !fi.IsDir():
		return &fs.PathError{Op: "mount point", Path: dest, Err: ErrNotDirectory}
	}
	return nil
}

// octalMode is mode as mount(2)'s mode= option reads it, the sticky,
// setuid and setgid bits included.
func octalMode(mode os.FileMode) string {
	m := uint32(mode.Perm())
	if mode&os.ModeSticky != 0 {
		m |= unix.S_ISVTX
	}
	if mode&os.ModeSetgid != 0 {
		m |= unix.S_ISGID
	}
	if mode&os.ModeSetuid != 0 {
		m |= unix.S_ISUID
	}
	return fmt.Sprintf("%04o", m)
}

// LoopbackUp brings up the loopback interface of the calling thread's
// network namespace: a new one has it down.
func LoopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("loopback: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return fmt.Errorf("loopback: %w", err)
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("loopback flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("loopback up: %w", err)
	}
	return nil
}

// SetHostname names the calling thread's UTS namespace.
func SetHostname(name string) error {
	if err := unix.Sethostname([]byte(name)); err != nil {
		return fmt.Errorf("set hostname %q: %w", name, err)
	}
	return nil
}

// CloseExecFrom marks every file descriptor from first on close-on-exec, so
// that no descriptor the process inherited without it (its caller's open
// files, directories, sockets) reaches a program it starts.
func CloseExecFrom(first int) error {
	err := unix.CloseRange(uint(first), ^uint(0), unix.CLOSE_RANGE_CLOEXEC)
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.ENOSYS) && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("close-on-exec from fd %d: %w", first, err)
	}
	// Before Linux 5.11: one descriptor at a time.
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return err
	}
	for _, e := range entries {
		var fd int
		if _, err := fmt.Sscan(e.Name(), &fd); err != nil || fd < first {
			continue
		}
		unix.CloseOnExec(fd) // the directory's own descriptor is gone by now: ignore EBADF
	}
	return nil
}

// BindTreeReadOnly binds src's whole mount tree at dst, every mount of it
// read-only, nosuid and nodev and private (no mount events from or to the
// host), in a few system calls whatever the number of mounts: the tree is
// cloned detached, changed, then attached. It fails with an error matching
// ErrNotSupported where the kernel lacks the new mount API (before 5.12).
func BindTreeReadOnly(src, dst string) error {
	tree, err := unix.OpenTree(unix.AT_FDCWD, src, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
	if err != nil {
		return treeErr("clone mount tree", src, err)
	}
	defer unix.Close(tree)
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV, Propagation: unix.MS_PRIVATE}
	if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &attr); err != nil {
		return treeErr("make read-only", src, err)
	}
	if err := unix.MoveMount(tree, "", unix.AT_FDCWD, dst, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return treeErr("attach mount tree of "+src, dst, err)
	}
	return nil
}

func treeErr(op, path string, err error) error {
	if errors.Is(err, unix.ENOSYS) {
		return fmt.Errorf("%s %s: %w", op, path, ErrNotSupported)
	}
	return &fs.PathError{Op: op, Path: path, Err: err}
}
