package simnode

import (
	"context"
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

// The files that mark a directory as a simulated host tree gpuiso made.
const (
	// markerName is written before anything else is made in the directory
	// and removed last: a directory holding it is gpuiso's, and its dev,
	// proc and sys may be removed and made again.
	markerName = ".gpuiso-simulated-host"
	// completeName is written once the tree is whole.
	completeName = ".complete"
	// lockName is the lock file of trees made before the marker existed;
	// such a tree is still read (see legacyTree), never written.
	lockName = ".lock"
)

// OpenHost returns the node's host tree in dir: made there on first use (as
// MakeHost makes it, root needed) and found there afterwards, so that every
// process sees the same device nodes. Concurrent calls make it once (the
// maker holds a lock on dir itself); a tree a killed call left half made is
// made again. dir is refused as MakeHost refuses it, before anything is
// written: only a tree marked as gpuiso's is ever written to or removed,
// and only in a directory that no other user owns or may write in (an
// [*UntrustedError]). A tree found whole is read in-root and refused (an
// [*UntrustedError] too) where it holds what gpuiso never makes: a link, a
// device node of another major than its own, majors that are not free
// local ones of this host. On error, a directory it made on the way is
// removed again where nothing else was put in it.
func (n *Node) OpenHost(ctx context.Context, dir string) (*Host, error) {
	if n == nil || n.spec == nil {
		return nil, fmt.Errorf("open simulated host in %s: %w", dir, errNoNode)
	}
	if ctx == nil {
		return nil, fmt.Errorf("open simulated host in %s: nil context: %w", dir, node.ErrInvalid)
	}
	h, err := n.openHost(ctx, dir)
	if err != nil {
		return nil, fmt.Errorf("open simulated host in %s: %w", dir, err)
	}
	return h, nil
}

func (n *Node) openHost(ctx context.Context, dir string) (h *Host, err error) {
	root, made, err := hostDir(dir)
	if err != nil {
		return nil, err
	}
	if err := trusted(root); err != nil {
		return nil, err
	}
	if h, err := wholeHost(root); h != nil || err != nil {
		return h, err
	}
	if err := claimable(root); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		removeEmpty(root, made)
		return nil, err
	}
	defer func() {
		if err != nil {
			removeEmpty(root, made) // only if nothing is in it
		}
	}()
	r, err := openTrusted(root)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	lock, err := r.Open(".")
	if err != nil {
		return nil, err
	}
	defer lock.Close()
	if err := linux.Lock(ctx, lock); err != nil {
		return nil, err
	}
	defer linux.Unlock(lock)
	if h, err := wholeHost(root); h != nil || err != nil {
		return h, err
	}
	if err := claimable(root); err != nil {
		return nil, err
	}
	if marked(root) {
		// What a killed call left.
		if err := errors.Join(r.RemoveAll("dev"), r.RemoveAll("proc"), r.RemoveAll("sys")); err != nil {
			return nil, err
		}
	}
	majors, err := freeMajors(node.DefaultProcRoot, 3)
	if err != nil {
		return nil, err
	}
	h = hostAt(root)
	h.NVIDIAMajor, h.UVMMajor, h.CapsMajor = majors[0], majors[1], majors[2]
	if err := n.makeIn(r, h); err != nil {
		return nil, err
	}
	return h, nil
}

// wholeHost is the complete tree at root with the majors its /proc/devices
// names, or nil when root holds no complete tree gpuiso made. The tree is
// checked (checkTree) before it is used.
func wholeHost(root string) (*Host, error) {
	if _, err := os.Lstat(filepath.Join(root, completeName)); err != nil {
		return nil, nil
	}
	if !marked(root) {
		if ok, err := legacyTree(root); !ok || err != nil {
			return nil, err
		}
	}
	majors, err := checkTree(root)
	if err != nil {
		return nil, err
	}
	h := hostAt(root)
	h.NVIDIAMajor, h.UVMMajor, h.CapsMajor = majors["nvidia"], majors[node.NVIDIAUVM], majors[node.NVIDIACaps]
	return h, nil
}

// IsHostTree reports whether dir holds a simulated host tree: one marked
// as gpuiso's, or an earlier version's whole tree. It reads only dir's
// own entries; it says nothing of whether the tree may be used.
func IsHostTree(dir string) bool {
	if dir == "" {
		return false
	}
	if marked(dir) {
		return true
	}
	ok, _ := legacyTree(dir)
	return ok
}

// legacyTree reports whether root holds exactly what an earlier version
// made for a shared tree (dev, proc, sys, .lock and .complete, no marker):
// found whole, it is read as it is, but never written to or removed.
func legacyTree(root string) (bool, error) {
	names, err := entries(root)
	if err != nil {
		return false, err
	}
	for _, name := range names {
		if !slices.Contains([]string{"dev", "proc", "sys", lockName, completeName}, name) {
			return false, nil
		}
	}
	return len(names) >= 4, nil // dev, proc, sys, .complete at least
}

// hostDir makes dir absolute and resolves the symlinks of its longest
// existing prefix, so that the checks see where files would really land,
// and refuses the host's own directories; it creates nothing. made is the
// first directory missing on the way to root, "" when root exists.
func hostDir(dir string) (root, made string, err error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", "", err
	}
	existing, rest := abs, ""
	for {
		if _, err := os.Lstat(existing); err == nil {
			break
		}
		parent := filepath.Dir(existing)
		if parent == existing {
			break
		}
		rest = filepath.Join(filepath.Base(existing), rest)
		existing = parent
	}
	real, err := filepath.EvalSymlinks(existing)
	if err != nil {
		return "", "", err
	}
	root = filepath.Join(real, rest)
	if hostPath(root) {
		return "", "", &HostPathError{Dir: dir, Resolved: root}
	}
	if rest != "" {
		first, _, _ := strings.Cut(rest, string(filepath.Separator))
		return root, filepath.Join(real, first), nil
	}
	if fi, err := os.Stat(root); err != nil {
		return "", "", err
	} else if !fi.IsDir() {
		return "", "", &fs.PathError{Op: "use as simulated host tree", Path: root, Err: errNotDir}
	}
	return root, "", nil
}

var errNotDir = errors.New("not a directory")

// errNoNode: a method called on a nil Node, or one not made by New or
// NewFromSpec.
var errNoNode = fmt.Errorf("no simulated node (a nil Node, or one not made by New): %w", node.ErrInvalid)

// checkHostPath resolves dir as hostDir does and refuses the host's own
// directories.
func checkHostPath(dir string) (string, error) {
	if dir == "" {
		return "", fmt.Errorf("no root directory: %w", node.ErrInvalid)
	}
	root, _, err := hostDir(dir)
	return root, err
}

// hostPath reports whether a resolved path is the host's own root or lies
// in its /dev, /proc or /sys.
func hostPath(p string) bool {
	if p == "/" {
		return true
	}
	for _, d := range []string{"/dev", "/proc", "/sys"} {
		if p == d || strings.HasPrefix(p, d+"/") {
			return true
		}
	}
	return false
}

// claimable refuses a root that exists, is not marked as gpuiso's, and is
// not empty.
func claimable(root string) error {
	if marked(root) {
		return nil
	}
	names, err := entries(root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	return claimableEntries(root, names)
}

// claimableEntries refuses root, listed as names after marked(root) was
// found false, unless the listing holds nothing of anyone else's. Another
// process may have marked root since (the listing then holds the marker
// and what it made after it), or be removing its tree (the marker goes
// last, so it may be all that was listed): neither is a user's directory.
func claimableEntries(root string, names []string) error {
	others := slices.DeleteFunc(slices.Clone(names), func(n string) bool { return n == markerName })
	if len(others) == 0 || marked(root) {
		return nil
	}
	return &NotOwnedError{Dir: root, Entries: names}
}

// owned refuses a root not marked as gpuiso's.
func owned(root string) error {
	if marked(root) {
		return nil
	}
	names, err := entries(root)
	if err != nil {
		return err
	}
	return &NotOwnedError{Dir: root, Entries: names}
}

func marked(root string) bool {
	fi, err := os.Lstat(filepath.Join(root, markerName))
	return err == nil && fi.Mode().IsRegular()
}

// mark writes the marker into r, reporting whether it was not there.
func mark(r *os.Root) (bool, error) {
	f, err := r.OpenFile(markerName, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if errors.Is(err, fs.ErrExist) {
		if fi, err := r.Lstat(markerName); err == nil && fi.Mode().IsRegular() {
			return false, nil
		}
	}
	if err != nil {
		return false, err
	}
	_, err = f.WriteString("a simulated GPU node's host tree, made by gpuiso: its dev, proc and sys may be removed and made again\n")
	return true, errors.Join(err, f.Close())
}

// entries are the names in dir, sorted.
func entries(dir string) ([]string, error) {
	list, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(list))
	for _, e := range list {
		names = append(names, e.Name())
	}
	return names, nil
}

// removeEmpty removes root and its parents up to made (the first directory
// made on the way to it), each only if empty; made == "" removes nothing.
func removeEmpty(root, made string) {
	if made == "" {
		return
	}
	for p := root; ; p = filepath.Dir(p) {
		// A directory not made (MkdirAll stopped short) is skipped.
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) || p == made || len(p) <= len(made) {
			return
		}
	}
}
