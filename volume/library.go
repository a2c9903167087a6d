package volume

import (
	"context"
	"errors"
	"fmt"
	"os"
)

// Library returns the host path of the 64-bit library that the ld.so cache
// of the driver root ([Manager.DriverRoot]) names soname (a key of the
// cache, such as "libnvidia-ml.so.1"), its symlink chain followed inside
// the driver root as a process whose root it is would follow it. A program
// that loads NVML from a driver installed elsewhere (a containerised
// driver's root mounted into a pod) loads the file this returns. It changes
// nothing.
//
// Where the cache names soname more than once, the first entry whose chain
// ends at a regular file wins. The error matches [ErrInvalidName] for a
// soname that is not one name, [ErrNoDriver] when the cache names no such
// library or none of its entries leads to a regular file inside the root
// (those entries' own errors, [ErrEscapesRoot] among them, are joined to
// it), and the cache's error when no driver root's cache can be read.
func (m *Manager) Library(ctx context.Context, soname string) (string, error) {
	if err := m.made(); err != nil {
		return "", err
	}
	if !validName(soname) {
		return "", fmt.Errorf("library %q: %w", soname, ErrInvalidName)
	}
	if err := ctx.Err(); err != nil {
		return "", err
	}
	d, err := m.driver(ctx)
	if err != nil {
		return "", fmt.Errorf("library %s: %w", soname, err)
	}
	errs := []error{ErrNoDriver}
	for _, e := range d.cache.Entries {
		if e.Key != soname || !e.IsELF() || e.Bits() != 64 {
			continue
		}
		resolved, err := resolve(d.root, e.Value)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		p := d.hostPath(resolved)
		fi, err := os.Lstat(p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !fi.Mode().IsRegular() {
			errs = append(errs, fmt.Errorf("%s: %s is not a regular file", e.Value, resolved))
			continue
		}
		return p, nil
	}
	return "", fmt.Errorf("library %s: no 64-bit entry of the ld.so cache of driver root %s leads to its file: %w", soname, d.root, errors.Join(errs...))
}
