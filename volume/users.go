package volume

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/gpuiso/gpuiso/node"
)

// Acquire records user (a container id) as a user of the volume of version,
// which must exist. A volume with users survives GC. Acquiring twice is the
// same as once.
func (m *Manager) Acquire(ctx context.Context, version, user string) error {
	if err := m.made(); err != nil {
		return err
	}
	if err := errors.Join(ValidateVersion(version), validUser(user)); err != nil {
		return fmt.Errorf("acquire volume %s for %s: %w", version, user, err)
	}
	unlock, err := m.lock(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	dir := filepath.Join(m.cfg.root, Prefix+version)
	if _, err := m.existing(dir); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			err = ErrNotFound
		}
		return fmt.Errorf("acquire volume %s for %s: %w", version, user, err)
	}
	// Private: the records list containers (see privateUsers).
	udir := filepath.Join(m.cfg.root, usersDir, version)
	err = mkdirPrivate(filepath.Dir(udir))
	if err == nil {
		err = mkdirPrivate(udir)
	}
	if err == nil {
		err = writeRecord(filepath.Join(udir, user))
	}
	if err != nil {
		return fmt.Errorf("acquire volume %s for %s: %w", version, user, err)
	}
	return nil
}

// Release forgets user as a user of the volume of version. Releasing a user
// that holds nothing does nothing, so that cleaning up after a crash may
// repeat itself.
func (m *Manager) Release(ctx context.Context, version, user string) error {
	if err := m.made(); err != nil {
		return err
	}
	if err := errors.Join(ValidateVersion(version), validUser(user)); err != nil {
		return fmt.Errorf("release volume %s for %s: %w", version, user, err)
	}
	unlock, err := m.lock(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	err = os.Remove(filepath.Join(m.cfg.root, usersDir, version, user))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("release volume %s for %s: %w", version, user, err)
	}
	return nil
}

// List returns the volumes under the root, by version, with their users.
// A volume that cannot be read is left out and its error joined to the
// returned one.
func (m *Manager) List(ctx context.Context) ([]Volume, error) {
	if err := m.made(); err != nil {
		return nil, err
	}
	if _, err := os.Lstat(m.cfg.root); errors.Is(err, fs.ErrNotExist) {
		return nil, nil // no root, no volumes: nothing is created
	}
	unlock, err := m.lock(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	return m.list()
}

func (m *Manager) list() ([]Volume, error) {
	entries, err := os.ReadDir(m.cfg.root)
	if err != nil {
		return nil, fmt.Errorf("list volumes: %w", err)
	}
	var vols []Volume
	var errs []error
	for _, e := range entries {
		if _, ok := volumeVersion(e.Name()); !ok {
			continue
		}
		dir := filepath.Join(m.cfg.root, e.Name())
		mf, err := m.existing(dir)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		v, err := m.volume(dir, mf, false, nil)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		vols = append(vols, *v)
	}
	slices.SortFunc(vols, func(a, b Volume) int { return node.CompareVersions(a.Version, b.Version) })
	return vols, errors.Join(errs...)
}

// users lists the users of the volume of version.
func (m *Manager) users(version string) ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(m.cfg.root, usersDir, version))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("users of volume %s: %w", version, err)
	}
	var users []string
	for _, e := range entries {
		users = append(users, e.Name())
	}
	return users, nil
}

// GC removes the volumes no user holds, except the versions in keep, and
// what crashed builds left behind. It returns the versions removed. A
// volume that cannot be removed (or is unsafe) stays, and its error is
// joined to the returned one.
func (m *Manager) GC(ctx context.Context, keep ...string) ([]string, error) {
	if err := m.made(); err != nil {
		return nil, err
	}
	for _, k := range keep {
		if err := ValidateVersion(k); err != nil {
			return nil, fmt.Errorf("gc volumes: keep: %w", err)
		}
	}
	if _, err := os.Lstat(m.cfg.root); errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	unlock, err := m.lock(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	entries, err := os.ReadDir(m.cfg.root)
	if err != nil {
		return nil, fmt.Errorf("gc volumes: %w", err)
	}
	var removed []string
	var errs []error
	for _, e := range entries {
		name := e.Name()
		p := filepath.Join(m.cfg.root, name)
		if strings.HasPrefix(name, tmpPrefix) || strings.HasPrefix(name, trashName) {
			errs = append(errs, os.RemoveAll(p)) // left by a crash: nobody builds now
			continue
		}
		version, ok := volumeVersion(name)
		if !ok || slices.Contains(keep, version) {
			continue
		}
		users, err := m.users(version)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if len(users) > 0 {
			continue
		}
		fi, err := os.Lstat(p)
		if err == nil {
			err = m.checkDir(p, fi)
		}
		if err == nil {
			err = os.RemoveAll(p)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("gc volume %s: %w", version, err))
			continue
		}
		os.Remove(filepath.Join(m.cfg.root, usersDir, version))
		m.cfg.logger.InfoContext(ctx, "removed unused volume", "path", p)
		removed = append(removed, version)
	}
	return removed, errors.Join(errs...)
}

// validUser checks a user name: a container id or name, one path element.
func validUser(u string) error {
	ok := u != "" && len(u) <= 255 && validName(u) && !strings.HasPrefix(u, ".")
	for _, r := range u {
		ok = ok && (r == '-' || r == '_' || r == '.' || r == ':' || r == '@' ||
			(r >= '0' && r <= '9') || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z'))
	}
	if !ok {
		return fmt.Errorf("user %q: %w", u, ErrInvalidName)
	}
	return nil
}
