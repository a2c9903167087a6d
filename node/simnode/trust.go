package simnode

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/node"
)

// A simulated host tree decides which device numbers a node's GPUs have:
// whoever can write in it, or replace it, can point them at any device of
// the host (/dev/mem). So a tree is made and read only where no other user
// can: its directory and every parent owned by root (or by the calling
// user, who is the one making it) and writable by no one else. A parent
// writable by all but sticky (/tmp) is let through when the directory
// below it is trusted: no other user can remove or rename that.

// trusted refuses root (absolute, the symlinks of its existing part
// resolved) where it, or a parent of it, is not trusted. A part of root
// that does not exist yet is the caller's to make, and to check again
// once made.
func trusted(root string) error {
	paths := []string{"/"}
	for _, part := range strings.Split(strings.TrimPrefix(filepath.Clean(root), "/"), "/") {
		if part != "" {
			paths = append(paths, filepath.Join(paths[len(paths)-1], part))
		}
	}
	for i, p := range paths {
		fi, err := os.Lstat(p)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := trustedFile(root, p, fi, i < len(paths)-1); err != nil {
			return err
		}
	}
	return nil
}

// trustedFile refuses the directory p (root or a parent of it, parent
// true) that fi describes where another user owns it or may write in it.
func trustedFile(root, p string, fi fs.FileInfo, parent bool) error {
	untrusted := func(format string, a ...any) error {
		return &UntrustedError{Dir: root, Path: p, Reason: fmt.Sprintf(format, a...)}
	}
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		return untrusted("a symbolic link")
	case !fi.IsDir():
		return &fs.PathError{Op: "use as simulated host tree", Path: p, Err: errNotDir}
	}
	if uid, ok := linux.Owner(fi); ok && uid != 0 && uid != uint32(os.Geteuid()) {
		return untrusted("owned by uid %d", uid)
	}
	if fi.Mode().Perm()&0o022 != 0 && !(parent && fi.Mode()&fs.ModeSticky != 0) {
		return untrusted("writable by group or others (mode %04o)", fi.Mode().Perm())
	}
	return nil
}

// openTrusted opens root, which exists, as an [os.Root] after checking
// it and its parents, and checks the directory it opened again: every
// later step works in that very directory, links inside it never
// leading out.
func openTrusted(root string) (*os.Root, error) {
	if err := trusted(root); err != nil {
		return nil, err
	}
	r, err := os.OpenRoot(root)
	if err != nil {
		return nil, err
	}
	fi, err := r.Stat(".")
	if err == nil {
		err = trustedFile(root, root, fi, false)
	}
	if err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// checkTree refuses a tree at root that holds what gpuiso never makes:
// dev, proc or sys not a directory of root's own, device majors that are
// not free local ones of this host, a device node in dev of another major
// (such as /dev/mem's), or a link there. It reads in-root only, and
// returns the majors of the tree's /proc/devices.
func checkTree(root string) (map[string]uint32, error) {
	untrusted := func(p, format string, a ...any) error {
		return &UntrustedError{Dir: root, Path: filepath.Join(root, p), Reason: fmt.Sprintf(format, a...)}
	}
	for _, d := range []string{"dev", "proc", "sys"} {
		fi, err := os.Lstat(filepath.Join(root, d))
		if err != nil {
			return nil, err
		}
		if !fi.IsDir() {
			return nil, untrusted(d, "not a directory but %s", kind(fi))
		}
		if err := trustedFile(root, filepath.Join(root, d), fi, false); err != nil {
			return nil, err
		}
	}
	f, err := linux.OpenFileInRoot(root, "proc/devices")
	if err != nil {
		return nil, fmt.Errorf("simulated host tree %s: %w", root, err)
	}
	majors, err := node.ParseProcDevices(f)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("simulated host tree %s: %w", root, err)
	}
	used, err := charMajors(filepath.Join(node.DefaultProcRoot, "devices"))
	if err != nil {
		return nil, err
	}
	var own []uint32
	for _, name := range []string{"nvidia", node.NVIDIAUVM, node.NVIDIACaps} {
		m, ok := majors[name]
		if !ok {
			return nil, untrusted("proc/devices", "without a major for %s", name)
		}
		if !localMajor(m) || used[m] {
			return nil, untrusted("proc/devices", "naming major %d for %s, not a free local major of this host", m, name)
		}
		own = append(own, m)
	}
	for _, dir := range []string{"dev", filepath.Join("dev", node.NVIDIACapsDir)} {
		list, err := linux.ReadDirInRoot(root, dir, 0)
		if errors.Is(err, fs.ErrNotExist) && dir != "dev" {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("simulated host tree %s: %w", root, err)
		}
		for _, e := range list {
			p := filepath.Join(dir, e.Name())
			switch {
			case e.IsDir() && p == filepath.Join("dev", node.NVIDIACapsDir):
				continue
			case e.Type()&fs.ModeSymlink != 0:
				return nil, untrusted(p, "a symbolic link")
			case e.Type()&fs.ModeCharDevice == 0:
				return nil, untrusted(p, "not a character device")
			}
			num, err := linux.StatDevice(filepath.Join(root, p))
			if err != nil {
				return nil, err
			}
			if !slices.Contains(own, num.Major) {
				return nil, untrusted(p, "device %d:%d, not of the simulated node's majors %v", num.Major, num.Minor, own)
			}
		}
	}
	return majors, nil
}

// localMajor reports whether m lies in a range reserved for local use.
func localMajor(m uint32) bool {
	for _, r := range localMajors {
		if m >= r[0] && m <= r[1] {
			return true
		}
	}
	return false
}

// kind names the kind of file fi describes.
func kind(fi fs.FileInfo) string {
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		return "a symbolic link"
	case fi.Mode()&fs.ModeDevice != 0:
		return "a device node"
	case fi.Mode().IsRegular():
		return "a regular file"
	}
	return "a special file"
}
