package volume

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/gpuiso/gpuiso/internal/ldcache"
)

// DefaultDriverRoots are the driver roots a Manager tries, in order, unless
// told otherwise: the host's own root; the root of a containerised driver
// (NVIDIA's GPU operator); GKE's driver directory.
func DefaultDriverRoots() []string {
	return []string{"/", "/run/nvidia/driver", "/home/kubernetes/bin/nvidia"}
}

// driver is one driver root and its ld.so cache.
type driver struct {
	root  string
	cache *ldcache.Cache
}

// hostPath is p (as the driver root sees it) on this host.
func (d *driver) hostPath(p string) string {
	return filepath.Join(d.root, filepath.FromSlash(p))
}

// hasNVIDIA reports whether the cache names NVML or libcuda.
func hasNVIDIA(c *ldcache.Cache) bool {
	for _, e := range c.Entries {
		if e.IsELF() && (strings.HasPrefix(e.Key, "libnvidia-ml.so") || strings.HasPrefix(e.Key, "libcuda.so")) {
			return true
		}
	}
	return false
}

// DriverRoot returns the driver root the manager reads the driver from:
// the one given with [WithDriverRoot], else the first of the roots of
// [WithDriverRoots] (default [DefaultDriverRoots]) whose ld.so cache names
// NVIDIA's libraries, else the first root whose cache can be read.
func (m *Manager) DriverRoot(ctx context.Context) (string, error) {
	if err := m.made(); err != nil {
		return "", err
	}
	d, err := m.driver(ctx)
	if err != nil {
		return "", err
	}
	return d.root, nil
}

func (m *Manager) driver(ctx context.Context) (*driver, error) {
	var first *driver
	var errs []error
	for i, root := range m.cfg.driverRoots {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		c, err := m.readCache(root)
		if err != nil {
			// A candidate root that is not there is no error.
			if i == 0 || !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			}
			continue
		}
		d := &driver{root: root, cache: c}
		if len(m.cfg.driverRoots) == 1 || hasNVIDIA(c) {
			return d, nil
		}
		if first == nil {
			first = d
		}
	}
	if first != nil {
		return first, nil
	}
	return nil, errors.Join(errs...)
}

func (m *Manager) readCache(root string) (*ldcache.Cache, error) {
	p := filepath.Join(root, filepath.FromSlash(m.cfg.ldCache))
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("read ld.so cache: %w", err)
	}
	cache, err := ldcache.Parse(b)
	if err != nil {
		return nil, fmt.Errorf("read ld.so cache %s: %w", p, err)
	}
	return cache, nil
}
