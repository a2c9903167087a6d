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
	"time"

	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/node"
)

// The files that mark a directory as a simulated host tree gpuiso made.
const (
	// markerName is written before anything but the makers' lock is made
	// in the directory and removed last: a directory holding it is
	// gpuiso's, and its dev, proc and sys may be removed and made again.
	markerName = ".gpuiso-simulated-host"
	// completeName is written once the tree is whole.
	completeName = ".complete"
	// lockName is the lock file of trees made before the marker existed;
	// such a tree is still read (see legacyTree), never written.
	lockName = ".lock"
	// makeLockDir holds makeLockName, the lock the makers of a tree take
	// turns through: a directory of mode 0700 and a file of mode 0600,
	// both the maker's user's, so that no other user can open the file
	// and hold its lock. It is made before the marker and removed before
	// it; a directory holding nothing else is still claimable.
	makeLockDir  = ".lock.d"
	makeLockName = "make.lock"
)

// HostLockTimeout is how long OpenHost waits for another process making the
// same host tree, when the caller's context does not end sooner.
const HostLockTimeout = 2 * time.Minute

// ErrHostLocked: another process held a host tree's lock until the wait for
// it ended (HostLockTimeout, or the caller's context). See HostLockError.
var ErrHostLocked = node.Sentinel(node.ErrUnavailable, "simulated host tree locked")

// HostLockError is a wait for a host tree's lock that ended while another
// process held it.
type HostLockError struct {
	// Dir is the host tree's directory.
	Dir string
	// Holder is the process holding the lock, as it named itself on taking
	// it; nil when unknown.
	Holder *node.Process
	// Command is the holder's command name, "" when unknown.
	Command string
	// Err is why the wait ended: context.DeadlineExceeded, or the
	// context's cause.
	Err error
}

func (e *HostLockError) Error() string {
	who := "another process (unknown)"
	if e.Holder != nil {
		who = fmt.Sprintf("pid %d started at %d", e.Holder.Pid, e.Holder.Start)
		if e.Command != "" {
			who = fmt.Sprintf("pid %d (%s) started at %d", e.Holder.Pid, e.Command, e.Holder.Start)
		}
	}
	return fmt.Sprintf("simulated host tree %s held by %s: %v: %s", e.Dir, who, e.Err, ErrHostLocked)
}

// Unwrap returns why the wait ended.
func (e *HostLockError) Unwrap() error { return e.Err }

// Is matches ErrHostLocked and node.ErrUnavailable.
func (e *HostLockError) Is(target error) bool { return errors.Is(ErrHostLocked, target) }

// OpenHost returns the node's host tree in dir: made there on first use (as
// MakeHost makes it, root needed) and found there afterwards, so that every
// process sees the same device nodes. Concurrent calls make it once: the
// makers take turns through the lock file .lock.d/make.lock in dir (mode
// 0600 in a directory of mode 0700, so that no other user can hold it), and
// a wait ends at HostLockTimeout or with ctx, whichever comes first, in a
// [*HostLockError] naming the holder where known. A tree a killed call left
// half made is made again. dir is refused as MakeHost refuses it, before anything is
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
	h, err := n.openHost(ctx, dir, HostLockTimeout)
	if err != nil {
		return nil, fmt.Errorf("open simulated host in %s: %w", dir, err)
	}
	return h, nil
}

func (n *Node) openHost(ctx context.Context, dir string, timeout time.Duration) (h *Host, err error) {
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
	lock, err := lockHost(ctx, root, timeout)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil && !marked(root) {
			// Nothing of the tree is left: the lock goes too, while
			// held (a waiter finds its file gone and locks a new one).
			removeMakeLock(root)
		}
		linux.Unlock(lock)
		lock.Close()
	}()
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

// lockHost takes the makers' lock of the trusted directory root, making
// its directory and file when missing, and waits for it no longer than
// timeout and ctx: a wait that ends is a *HostLockError. It returns the
// locked file.
func lockHost(ctx context.Context, root string, timeout time.Duration) (*os.File, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	dir := filepath.Join(root, makeLockDir)
	path := filepath.Join(dir, makeLockName)
	uid := os.Geteuid()
	for {
		if err := linux.PrivateDir(dir, uid); err != nil {
			return nil, fmt.Errorf("simulated host tree lock: %w", err)
		}
		f, err := linux.OpenLockFile(dir, makeLockName, uid)
		var unsafe *linux.UnsafeLockError
		if errors.Is(err, fs.ErrNotExist) && ctx.Err() == nil {
			continue // the directory was removed meanwhile
		}
		if err != nil && !errors.As(err, &unsafe) {
			os.Remove(dir) // made here, or left by a killed call: only if empty
		}
		if err != nil {
			return nil, fmt.Errorf("simulated host tree lock: %w", err)
		}
		if err := linux.Lock(ctx, f); err != nil {
			defer f.Close()
			if ctx.Err() != nil {
				return nil, lockError(ctx, root, f, err)
			}
			return nil, fmt.Errorf("lock simulated host tree: %w", err)
		}
		held, err1 := f.Stat()
		now, err2 := os.Lstat(path)
		if err1 == nil && (errors.Is(err2, fs.ErrNotExist) || err2 == nil && !os.SameFile(held, now)) {
			// Removed (or made again) by its holder meanwhile.
			linux.Unlock(f)
			f.Close()
			continue
		}
		if err := errors.Join(err1, err2); err != nil {
			linux.Unlock(f)
			f.Close()
			return nil, fmt.Errorf("simulated host tree lock: %w", err)
		}
		linux.RecordHolder(f, node.DefaultProcRoot)
		return f, nil
	}
}

// lockError describes a wait for the lock f of root that ended: the
// process the lock file names, when it still runs.
func lockError(ctx context.Context, root string, f *os.File, waitErr error) error {
	cause := context.Cause(ctx)
	if cause == nil {
		cause = waitErr
	}
	e := &HostLockError{Dir: root, Err: cause}
	if p, command, ok := linux.RecordedHolder(f, node.DefaultProcRoot); ok {
		e.Holder = &p
		e.Command = command
	}
	return e
}

// ownMakeLock reports whether root holds the makers' lock directory as
// gpuiso makes it: a directory (not a link) of the calling user's, holding
// nothing but the lock file.
func ownMakeLock(root string) bool {
	dir := filepath.Join(root, makeLockDir)
	fi, err := os.Lstat(dir)
	if err != nil || !fi.IsDir() || fi.Mode().Perm()&0o077 != 0 {
		return false
	}
	if uid, ok := linux.Owner(fi); !ok || uid != uint32(os.Geteuid()) {
		return false
	}
	names, err := entries(dir)
	return err == nil && (len(names) == 0 || len(names) == 1 && names[0] == makeLockName)
}

// removeMakeLock removes the makers' lock directory of root, if gpuiso's.
func removeMakeLock(root string) error {
	if _, err := os.Lstat(filepath.Join(root, makeLockDir)); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if !ownMakeLock(root) {
		return &NotOwnedError{Dir: root, Entries: []string{makeLockDir}}
	}
	dir := filepath.Join(root, makeLockDir)
	if err := os.Remove(filepath.Join(dir, makeLockName)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
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
// The makers' lock directory, made before the marker, is gpuiso's where it
// is as gpuiso makes it (ownMakeLock).
func claimableEntries(root string, names []string) error {
	others := slices.DeleteFunc(slices.Clone(names), func(n string) bool {
		return n == markerName || n == makeLockDir && ownMakeLock(root)
	})
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
