package linux

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// A directory owned by a process is one that process makes for its own use
// while it runs (a temporary tree, a directory of links) and that no one
// needs once it has died. Its name records its owner: a prefix, the owner in
// node.Process's text form, "-", then a random suffix:
//
//	<prefix><pid>.<start>-<random>
//
// The owner is in the name from the moment the directory exists, so a
// process killed at any point leaves nothing that RemoveDeadOwned cannot
// tell from a directory in use. A directory whose owner is alive, or cannot
// be proven dead, is kept; so is one whose name records no owner.

// OwnedPattern is the os.MkdirTemp pattern of a directory owner owns:
// prefix, owner's text form and "-". Where owner is not Valid (the proc
// file system could not tell who the caller is) it is prefix alone: the
// directory then names no owner and is never removed as a dead one's.
func OwnedPattern(prefix string, owner Process) string {
	if !owner.Valid() {
		return prefix
	}
	return prefix + owner.String() + "-"
}

// MkdirOwned makes a new directory under parent owned by owner (see
// OwnedPattern), with mode 0700, and returns its path.
func MkdirOwned(parent, prefix string, owner Process) (string, error) {
	return os.MkdirTemp(parent, OwnedPattern(prefix, owner))
}

// OwnerOfName returns the owner a name made by OwnedPattern with prefix
// records; ok is false when the name does not have that form.
func OwnerOfName(name, prefix string) (owner Process, ok bool) {
	rest, ok := strings.CutPrefix(name, prefix)
	if !ok {
		return Process{}, false
	}
	id, _, ok := strings.Cut(rest, "-")
	if !ok {
		return Process{}, false
	}
	p, err := ParseProcess(id)
	if err != nil {
		return Process{}, false
	}
	return p, true
}

// OwnerDead reports whether name, a name made by OwnedPattern with prefix,
// records an owner that provably ended (see Dead).
func OwnerDead(procRoot, name, prefix string) bool {
	p, ok := OwnerOfName(name, prefix)
	return ok && Dead(procRoot, p)
}

// RemoveDeadOwned removes the directories under parent named with prefix
// whose owner provably ended, as the proc file system procRoot ("" means
// /proc) shows it, and returns their paths. Only directories are removed:
// a symbolic link, or any other file, of such a name is left alone, and
// the removal of a directory follows no link inside it. A parent that does
// not exist holds none. Failures to remove one directory do not stop the
// others; they are joined in the error.
func RemoveDeadOwned(procRoot, parent, prefix string) ([]string, error) {
	entries, err := os.ReadDir(parent)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("remove directories of dead processes: %w", err)
	}
	var removed []string
	var errs []error
	for _, e := range entries {
		if !e.IsDir() || !OwnerDead(procRoot, e.Name(), prefix) {
			continue
		}
		path := filepath.Join(parent, e.Name())
		if err := RemoveDir(path); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, path)
	}
	return removed, errors.Join(errs...)
}

// RemoveDir removes the directory path and what it holds, following no
// symbolic link: when path itself is a link it is an error matching
// ErrNotDirectory and nothing is removed. A path that does not exist is
// not an error.
func RemoveDir(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("remove %s: %w", path, ErrNotDirectory)
	}
	// os.RemoveAll unlinks the links it meets rather than following them.
	return os.RemoveAll(path)
}
