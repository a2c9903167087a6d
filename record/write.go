package record

import (
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// replacePath replaces the file at path with b as replace does.
func replacePath(path string, b []byte, perm fs.FileMode, sync bool) error {
	dir, err := os.OpenRoot(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer dir.Close()
	return replace(dir, filepath.Base(path), b, perm, sync)
}

// replace replaces the file name in dir with b so that a reader, or the
// writer's death, sees the old content or the new, never a part: b goes
// to a temporary file in dir, which gets perm and is renamed over name.
// With sync, the temporary file is synced before the rename and the
// directory after it, so that a machine crash leaves the old content or
// the new as well. The temporary file is ".<name>.<pid>.<random>.tmp"
// (synced) or ".<name>.<pid>.tmp" (not): the pid says whose a leftover
// is. On error name is as it was and the temporary file is removed.
func replace(dir *os.Root, name string, b []byte, perm fs.FileMode, sync bool) (err error) {
	tmp, f, err := createTemp(dir, name, perm, sync)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			dir.Remove(tmp)
		}
	}()
	_, err = f.Write(b)
	if err == nil {
		err = f.Chmod(perm)
	}
	if err == nil && sync {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := dir.Rename(tmp, name); err != nil {
		return err
	}
	if !sync {
		return nil
	}
	return syncDir(dir)
}

// createTemp makes the temporary file of a write of name: one of its own
// (created, never opened if it exists) for a synced write, the one of
// this process, truncated, for a write that is not.
func createTemp(dir *os.Root, name string, perm fs.FileMode, sync bool) (string, *os.File, error) {
	prefix := "." + name + "." + strconv.Itoa(os.Getpid())
	if !sync {
		tmp := prefix + ".tmp"
		f, err := dir.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, perm)
		return tmp, f, err
	}
	for range 100 {
		tmp := prefix + "." + strconv.FormatUint(uint64(rand.Uint32()), 10) + ".tmp"
		f, err := dir.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, perm)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		return tmp, f, err
	}
	return "", nil, &fs.PathError{Op: "createtemp", Path: prefix, Err: fs.ErrExist}
}

// syncDir flushes dir's entries (a rename, a removal) to disk.
func syncDir(dir *os.Root) error {
	d, err := dir.Open(".")
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// removePath removes the file at path (one already gone is not an
// error) and, with sync, syncs its directory.
func removePath(path string, sync bool) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if !sync {
		return nil
	}
	dir, err := os.OpenRoot(filepath.Dir(path))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer dir.Close()
	return syncDir(dir)
}

// Replace replaces the file at path with data as a Store's write does:
// atomically, synced, the directory synced after the rename. It is for a
// file whose content is a format of its own, which readers of earlier
// releases read too (the allocator's state): the envelope, checksum and
// versions are the caller's. perm 0 means 0600. A path that is not
// absolute is refused (ErrInvalidOptions) and nothing is written; a
// directory that does not exist is an error matching node.ErrNotFound.
func Replace(path string, data []byte, perm fs.FileMode) error {
	if err := absolute(filepath.Dir(path)); err != nil {
		return err
	}
	if !validName(filepath.Base(path)) || strings.HasSuffix(path, "/") {
		return fmt.Errorf("record file %q: no file name: %w", path, ErrInvalidOptions)
	}
	if perm == 0 {
		perm = 0o600
	}
	if err := replacePath(path, data, perm.Perm(), true); err != nil {
		return pathErr("replace "+path, err)
	}
	return nil
}
