package volume

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/gpuiso/gpuiso/internal/linux"
)

// The managers sharing a root take turns through a lock file that no other
// user can open: lockName, mode 0600, in the directory lockDir of the root,
// mode 0700, both the manager's user's. (Releases before it took a flock on
// the root directory itself, which any user can open and hold.) The
// records of the volumes' users, .users/<version>/<user>, are kept as
// private: 0700 directories, 0600 files.
const (
	lockDir  = ".lock"
	lockName = "volumes.lock"
)

// lock makes the root safe to use and takes its lock, waiting no longer
// than the lock timeout and ctx: a wait that ends is a *LockError. When the
// root's file system is noexec, it first mounts a tmpfs there. It returns
// the unlock.
func (m *Manager) lock(ctx context.Context) (func(), error) {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.lockTimeout)
	defer cancel()
	if err := mkdirAll(m.cfg.root); err != nil {
		return nil, fmt.Errorf("volume root: %w", err)
	}
	dir := filepath.Join(m.cfg.root, lockDir)
	path := filepath.Join(dir, lockName)
	for {
		// Checked before anything is made in it, and again once locked.
		if err := m.checkRoot(); err != nil {
			return nil, err
		}
		f, err := m.openLock(dir)
		if err != nil {
			return nil, err
		}
		if err := linux.Lock(ctx, f); err != nil {
			defer f.Close()
			if ctx.Err() != nil {
				return nil, m.lockError(ctx, f, err)
			}
			return nil, fmt.Errorf("lock volume root: %w", err)
		}
		unlock := func() { linux.Unlock(f); f.Close() }
		held, err1 := f.Stat()
		now, err2 := os.Lstat(path)
		if err1 == nil && (errors.Is(err2, fs.ErrNotExist) || err2 == nil && !os.SameFile(held, now)) {
			unlock() // a tmpfs was mounted on the root meanwhile: lock its file
			continue
		}
		if err := errors.Join(err1, err2); err != nil {
			unlock()
			return nil, fmt.Errorf("volume root lock: %w", err)
		}
		linux.RecordHolder(f, m.cfg.procRoot)
		if err := m.checkRoot(); err != nil {
			unlock()
			return nil, err
		}
		noexec, err := linux.Noexec(m.cfg.root)
		if err != nil {
			unlock()
			return nil, fmt.Errorf("volume root: %w", err)
		}
		if noexec && m.cfg.tmpfsOnNoexec {
			err = linux.MountTmpfs(m.cfg.root, dirMode)
			unlock()
			if err != nil {
				return nil, fmt.Errorf("volume root %s is noexec: %w", m.cfg.root, err)
			}
			m.cfg.logger.InfoContext(ctx, "mounted a tmpfs on the noexec volume root", "path", m.cfg.root)
			continue
		}
		if err := m.privateUsers(); err != nil {
			unlock()
			return nil, err
		}
		return unlock, nil
	}
}

// checkRoot refuses a root someone other than the manager's user could
// change.
func (m *Manager) checkRoot() error {
	fi, err := os.Lstat(m.cfg.root)
	if err != nil {
		return fmt.Errorf("volume root: %w", err)
	}
	return m.checkDir(m.cfg.root, fi)
}

// openLock opens the root's lock file in dir, making both when missing. A
// lock directory others may read (0755) is tightened; one they may write,
// or a lock file they could open, is refused with an *UnsafeError and left
// as it is: another user may hold such a file open, and its lock with it,
// whatever its mode becomes.
func (m *Manager) openLock(dir string) (*os.File, error) {
	err := linux.PrivateDir(dir, m.cfg.owner)
	var f *os.File
	if err == nil {
		f, err = linux.OpenLockFile(dir, lockName, m.cfg.owner)
	}
	var ue *linux.UnsafeLockError
	if errors.As(err, &ue) {
		return nil, &UnsafeError{Path: ue.Path, Reason: ue.Reason}
	}
	if err != nil {
		return nil, fmt.Errorf("volume root lock: %w", err)
	}
	return f, nil
}

// lockError describes a wait for the lock that ended: the process the lock
// file names, when it still runs.
func (m *Manager) lockError(ctx context.Context, f *os.File, waitErr error) error {
	cause := context.Cause(ctx)
	if cause == nil {
		cause = waitErr
	}
	e := &LockError{Root: m.cfg.root, Err: cause}
	if p, command, ok := linux.RecordedHolder(f, m.cfg.procRoot); ok {
		e.Holder = &p
		e.Command = command
	}
	return e
}

// privateUsers keeps the users' records to the manager's user: the users
// directory and every directory in it 0700, every record 0600. Records an
// older release left open to others (0755 directories) are copied into new
// private directories that then take their place, rather than tightened in
// place: a process of another user that opened one of the old directories
// could go on listing it. The caller holds the lock.
func (m *Manager) privateUsers() error {
	udir := filepath.Join(m.cfg.root, usersDir)
	fi, err := os.Lstat(udir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("volume users: %w", err)
	}
	if err := m.checkDir(udir, fi); err != nil {
		return err
	}
	records, private, err := m.readUsers(udir, fi)
	if err != nil || private {
		return err
	}
	tmp, err := os.MkdirTemp(m.cfg.root, tmpPrefix+"users-")
	if err != nil {
		return fmt.Errorf("volume users: %w", err)
	}
	keep := false
	defer func() {
		if !keep {
			os.RemoveAll(tmp)
		}
	}()
	for version, users := range records {
		if err := mkdirPrivate(filepath.Join(tmp, version)); err != nil {
			return fmt.Errorf("volume users: %w", err)
		}
		for _, u := range users {
			if err := writeRecord(filepath.Join(tmp, version, u)); err != nil {
				return fmt.Errorf("volume users: %w", err)
			}
		}
	}
	if err := os.Chmod(tmp, 0o700); err != nil {
		return fmt.Errorf("volume users: %w", err)
	}
	if err := m.install(tmp, udir); err != nil {
		return fmt.Errorf("volume users: %w", err)
	}
	keep = true
	return nil
}

// readUsers reads the users directory udir (fi): the users of each version,
// and whether every directory and record in it is already private. Entries
// that name no version or user are left out of a copy.
func (m *Manager) readUsers(udir string, fi fs.FileInfo) (map[string][]string, bool, error) {
	private := fi.Mode().Perm()&0o077 == 0
	entries, err := os.ReadDir(udir)
	if err != nil {
		return nil, false, fmt.Errorf("volume users: %w", err)
	}
	records := map[string][]string{}
	for _, e := range entries {
		version := e.Name()
		if ValidateVersion(version) != nil {
			continue
		}
		p := filepath.Join(udir, version)
		vi, err := os.Lstat(p)
		if err != nil {
			return nil, false, fmt.Errorf("volume users: %w", err)
		}
		if err := m.checkDir(p, vi); err != nil {
			return nil, false, err
		}
		private = private && vi.Mode().Perm()&0o077 == 0
		users, err := os.ReadDir(p)
		if err != nil {
			return nil, false, fmt.Errorf("volume users: %w", err)
		}
		for _, u := range users {
			if validUser(u.Name()) != nil || !u.Type().IsRegular() {
				continue
			}
			records[version] = append(records[version], u.Name())
			if private {
				ui, err := u.Info()
				private = err == nil && ui.Mode().Perm()&0o077 == 0
			}
		}
	}
	return records, private, nil
}

// mkdirPrivate makes the directory p with mode 0700, whatever the umask.
// An existing one is left as it is.
func mkdirPrivate(p string) error {
	err := os.Mkdir(p, 0o700)
	if errors.Is(err, fs.ErrExist) {
		return nil
	}
	if err != nil {
		return err
	}
	return os.Chmod(p, 0o700)
}

// writeRecord makes the empty record file p with mode 0600.
func writeRecord(p string) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return nil
	}
	if err != nil {
		return err
	}
	return f.Close()
}
