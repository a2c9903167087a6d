package linux

import (
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
)

// WriteFileAtomic replaces the file at path with data so that a reader,
// or a crash, sees the old content or the new, never a part: data goes to
// a temporary file in the same directory (named by pattern as
// os.CreateTemp names files; "" means ".<base>.*.tmp"), which gets perm,
// is synced, passes check (when not nil; it is given the temporary
// file's path), and is renamed over path; the directory is synced last.
// On error path is as it was and the temporary file is removed.
func WriteFileAtomic(path, pattern string, data []byte, perm fs.FileMode, check func(tmp string) error) (err error) {
	dir := filepath.Dir(path)
	if pattern == "" {
		pattern = "." + filepath.Base(path) + ".*.tmp"
	}
	tmp, err := os.CreateTemp(dir, pattern)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			os.Remove(tmp.Name())
		}
	}()
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Chmod(perm)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if check != nil {
		if err := check(tmp.Name()); err != nil {
			return err
		}
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	return SyncDir(dir)
}

// SyncDir flushes a directory's entries (a rename, a removal) to disk.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// ReplaceFile replaces the file at path with data as WriteFileAtomic does,
// a reader seeing the old content or the new, never a part, but without
// the syncs: the replacement is atomic against the writer's death, not the
// machine's. It is for state that describes running processes, which no
// machine crash outlives (a container's record, its exit status): after a
// crash such a file may be empty, and its reader treats it as gone.
func ReplaceFile(path string, data []byte, perm fs.FileMode) error {
	dir, err := os.OpenRoot(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer dir.Close()
	return ReplaceFileIn(dir, filepath.Base(path), data, perm)
}

// ReplaceFileIn is ReplaceFile for the file name in dir, through a handle
// on the directory (one opened before a process left the file system that
// holds it, say).
func ReplaceFileIn(dir *os.Root, name string, data []byte, perm fs.FileMode) (err error) {
	tmp := "." + name + "." + strconv.Itoa(os.Getpid()) + ".tmp"
	f, err := dir.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, perm)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			dir.Remove(tmp)
		}
	}()
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return dir.Rename(tmp, name)
}
