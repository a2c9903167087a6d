package volume

import (
	"errors"
	"fmt"
	"log/slog"
	"path"
	"path/filepath"
	"slices"
	"time"

	"github.com/gpuiso/gpuiso/node"
)

// Option configures a Manager.
type Option func(*config) error

// WithRoot sets the directory holding the volumes (default DefaultRoot).
func WithRoot(dir string) Option {
	return func(c *config) error {
		if !filepath.IsAbs(dir) {
			return fmt.Errorf("root %q: not an absolute path: %w", dir, ErrInvalidName)
		}
		c.root = filepath.Clean(dir)
		return nil
	}
}

// WithDriverRoot sets the directory the driver is installed under, such as
// /run/nvidia/driver for a containerised driver: the ld.so cache, the binary
// directories and every path they name are read below it, and no other root
// is tried. By default the first of [DefaultDriverRoots] whose ld.so cache
// names NVIDIA's libraries is used.
func WithDriverRoot(dir string) Option { return WithDriverRoots(dir) }

// WithDriverRoots sets the driver roots tried in order: the first whose
// ld.so cache names NVIDIA's libraries is used (default
// [DefaultDriverRoots]).
func WithDriverRoots(dirs ...string) Option {
	return func(c *config) error {
		if len(dirs) == 0 {
			return fmt.Errorf("no driver root: %w", ErrInvalidName)
		}
		var roots []string
		for _, d := range dirs {
			if !filepath.IsAbs(d) {
				return fmt.Errorf("driver root %q: not an absolute path: %w", d, ErrInvalidName)
			}
			roots = append(roots, filepath.Clean(d))
		}
		c.driverRoots = roots
		return nil
	}
}

// WithLDCache sets the ld.so cache's path under the driver root (default
// "/etc/ld.so.cache").
func WithLDCache(p string) Option {
	return func(c *config) error {
		if !path.IsAbs(p) {
			return fmt.Errorf("ld.so cache %q: not an absolute path: %w", p, ErrInvalidName)
		}
		c.ldCache = p
		return nil
	}
}

// WithBinDirs sets the directories under the driver root searched for the
// driver's programs, in order (default /usr/bin, /usr/sbin, /bin, /sbin,
// /usr/local/bin); the bin directory beside the driver's library directory
// (/usr/local/nvidia/bin for /usr/local/nvidia/lib64) is searched after them.
func WithBinDirs(dirs ...string) Option {
	return func(c *config) error { return absDirs("binary", dirs, &c.binDirs) }
}

func absDirs(what string, dirs []string, dst *[]string) error {
	for _, d := range dirs {
		if !path.IsAbs(d) {
			return fmt.Errorf("%s directory %q: not an absolute path: %w", what, d, ErrInvalidName)
		}
	}
	*dst = slices.Clone(dirs)
	return nil
}

// WithProcRoot sets where proc is mounted (default "/proc"), read for the
// loaded kernel driver's version.
func WithProcRoot(dir string) Option {
	return func(c *config) error {
		c.procRoot = dir
		return nil
	}
}

// WithCapabilities sets the capabilities the volume serves (default all).
func WithCapabilities(caps ...Capability) Option {
	return func(c *config) error {
		for _, cap := range caps {
			if !slices.Contains(AllCapabilities(), cap) {
				return fmt.Errorf("capability %q: %w", cap, ErrInvalidName)
			}
		}
		c.caps = normalizeCapabilities(caps)
		return nil
	}
}

// WithDriverVersion fixes the driver version instead of detecting it.
func WithDriverVersion(v string) Option {
	return func(c *config) error {
		if err := ValidateVersion(v); err != nil {
			return err
		}
		c.version = v
		return nil
	}
}

// WithNVML sets the function asking the loaded driver for its version.
func WithNVML(f VersionFunc) Option {
	return func(c *config) error {
		c.nvml = f
		return nil
	}
}

// WithLinks chooses whether files are hard-linked where the root and the
// driver share a file system (the default, true) or always copied.
func WithLinks(on bool) Option {
	return func(c *config) error {
		c.links = on
		return nil
	}
}

// WithTmpfsOnNoexec chooses whether a tmpfs is mounted on a root whose file
// system is mounted noexec (default true), as Mesos does.
func WithTmpfsOnNoexec(on bool) Option {
	return func(c *config) error {
		c.tmpfsOnNoexec = on
		return nil
	}
}

// WithDeepVerify makes Build read every copied file for its checksum, and
// check that every linked file is still the host's, before trusting an
// existing volume; by default Build checks names, types, sizes, modes,
// times, inodes and link targets only.
func WithDeepVerify(on bool) Option {
	return func(c *config) error {
		c.deepVerify = on
		return nil
	}
}

// WithLogger sets where the manager tells what it builds and removes
// (default: nowhere).
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return errors.New("nil logger")
		}
		c.logger = l
		return nil
	}
}

// DefaultLockTimeout is how long a call waits for the root's lock, held by
// another manager (in this process or another), unless [WithLockTimeout]
// says otherwise.
const DefaultLockTimeout = 2 * time.Minute

// WithLockTimeout sets the longest a call waits for the root's lock (default
// [DefaultLockTimeout]); the caller's context may end the wait sooner. A wait
// that ends is a [*LockError] naming the holder where it is known. d must be
// positive.
func WithLockTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("lock timeout %v: not positive: %w", d, node.ErrInvalid)
		}
		c.lockTimeout = d
		return nil
	}
}
