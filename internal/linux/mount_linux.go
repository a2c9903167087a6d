package linux

import (
	"io/fs"

	"golang.org/x/sys/unix"
)

// MountDevTmpfs mounts a tmpfs that may hold device nodes (nosuid, not
// nodev, mode 0755): a container's private /dev.
func MountDevTmpfs(path string) error {
	if err := unix.Mount("tmpfs", path, "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "mode=0755,size=65536k"); err != nil {
		return &fs.PathError{Op: "mount tmpfs", Path: path, Err: err}
	}
	return nil
}

// MakeRSlave makes every mount under path a slave of its peers: mounts made
// afterwards in this mount namespace no longer reach the host's.
func MakeRSlave(path string) error {
	if err := unix.Mount("", path, "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return &fs.PathError{Op: "make rslave", Path: path, Err: err}
	}
	return nil
}

// MakeRPrivate makes the mount at path and every mount below it private:
// they neither send nor receive mount events.
func MakeRPrivate(path string) error {
	if err := unix.Mount("", path, "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return &fs.PathError{Op: "make rprivate", Path: path, Err: err}
	}
	return nil
}

// BindMount binds src (recursively) onto dst; with readOnly the bind is then
// remounted read-only, nosuid and nodev.
func BindMount(src, dst string, readOnly bool) error {
	if err := unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return &fs.PathError{Op: "bind mount " + src, Path: dst, Err: err}
	}
	if !readOnly {
		return nil
	}
	flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV)
	if err := unix.Mount("", dst, "", flags, ""); err != nil {
		return &fs.PathError{Op: "remount read-only", Path: dst, Err: err}
	}
	return nil
}

// MountDevpts mounts a new, private devpts instance (pseudo terminals) at
// path.
func MountDevpts(path string) error {
	if err := unix.Mount("devpts", path, "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620"); err != nil {
		return &fs.PathError{Op: "mount devpts", Path: path, Err: err}
	}
	return nil
}

// DetachUnmount lazily unmounts path (MNT_DETACH): it disappears at once and
// is freed when nothing uses it any more.
func DetachUnmount(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil {
		return &fs.PathError{Op: "unmount", Path: path, Err: err}
	}
	return nil
}

// CloneNewNS is the clone flag of a new mount namespace.
const CloneNewNS = unix.CLONE_NEWNS

// MakeShared makes the mount at path shared: mounts made under it later
// propagate to its copies in other mount namespaces (and to their slaves).
func MakeShared(path string) error {
	if err := unix.Mount("", path, "", unix.MS_SHARED, ""); err != nil {
		return &fs.PathError{Op: "make shared", Path: path, Err: err}
	}
	return nil
}

// BindMountNoSUID binds src (recursively) onto dst, writable, with setuid
// bits and device files of the bind ignored (nosuid, nodev): a directory a
// container shares with its host, where it may write but must not plant
// what would give it or the host's users more privilege.
func BindMountNoSUID(src, dst string) error {
	if err := unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return &fs.PathError{Op: "bind mount " + src, Path: dst, Err: err}
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dst, &st); err != nil {
		return &fs.PathError{Op: "statfs", Path: dst, Err: err}
	}
	// A remount of a bind sets all its flags: keep those of the source.
	flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_NOSUID | unix.MS_NODEV)
	for _, f := range [][2]uintptr{{unix.ST_RDONLY, unix.MS_RDONLY}, {unix.ST_NOEXEC, unix.MS_NOEXEC}, {unix.ST_NOATIME, unix.MS_NOATIME}, {unix.ST_NODIRATIME, unix.MS_NODIRATIME}, {unix.ST_RELATIME, unix.MS_RELATIME}} {
		if uintptr(st.Flags)&f[0] != 0 {
			flags |= f[1]
		}
	}
	if err := unix.Mount("", dst, "", flags, ""); err != nil {
		return &fs.PathError{Op: "remount nosuid", Path: dst, Err: err}
	}
	return nil
}
