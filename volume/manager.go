package volume

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/node"
)

// DefaultRoot is where a Manager keeps its volumes unless told otherwise.
const DefaultRoot = "/var/run/gpuiso/volumes"

// Prefix is the name of a volume's directory before its driver version.
const Prefix = "nvidia_"

// Names inside the root that are not volumes.
const (
	usersDir   = ".users"
	tmpPrefix  = ".tmp-"
	trashName  = ".trash-"
	dirMode    = 0o755
	copyBuffer = 1 << 20
)

// Manager builds and keeps the driver volumes under one root directory.
// Its methods may be called from several goroutines, and several managers
// (in several processes) may share a root: the root's lock file serialises
// them (see lock.go).
type Manager struct {
	cfg config
}

type config struct {
	root          string
	driverRoots   []string
	ldCache       string
	binDirs       []string
	procRoot      string
	caps          []Capability
	version       string
	nvml          VersionFunc
	links         bool
	tmpfsOnNoexec bool
	deepVerify    bool
	owner         int
	lockTimeout   time.Duration
	logger        *slog.Logger
}

// ErrNotMade: a Manager was not made with New (its zero value).
var ErrNotMade = node.NotMade("volume manager not made with New")

// made refuses a Manager's zero value.
func (m *Manager) made() error {
	if m == nil || m.cfg.root == "" {
		return ErrNotMade
	}
	return nil
}

// New returns a manager. It touches nothing until a method is called.
func New(opts ...Option) (*Manager, error) {
	c := config{
		root:          DefaultRoot,
		driverRoots:   DefaultDriverRoots(),
		ldCache:       "/etc/ld.so.cache",
		binDirs:       []string{"/usr/bin", "/usr/sbin", "/bin", "/sbin", "/usr/local/bin"},
		procRoot:      "/proc",
		caps:          normalizeCapabilities(AllCapabilities()),
		links:         true,
		tmpfsOnNoexec: true,
		owner:         os.Geteuid(),
		lockTimeout:   DefaultLockTimeout,
		logger:        slog.New(slog.DiscardHandler),
	}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("volume manager: nil option: %w", node.ErrInvalid)
		}
		if err := o(&c); err != nil {
			return nil, fmt.Errorf("volume manager: %w", err)
		}
	}
	return &Manager{cfg: c}, nil
}

// Root returns the directory holding the volumes.
func (m *Manager) Root() string { return m.cfg.root }

// Volume is a built volume of one driver version.
type Volume struct {
	// Version is the driver version.
	Version string
	// Path is the volume's directory on the host.
	Path string
	// Files is the number of files (programs and libraries) it holds.
	Files int
	// Links is the number of symlinks it holds.
	Links int
	// Capabilities are the capabilities it serves.
	Capabilities []Capability
	// Users are the users (containers) registered with Acquire.
	Users []string
	// Warnings are what was left out when it was built (empty when it was
	// found intact rather than built).
	Warnings []string
	// Built is true when this call built it, false when it was found intact.
	Built bool
}

// Build returns the volume of the driver's version, building it when it is
// missing, damaged or lacks a capability asked for. Concurrent calls, in this
// process or others, build it once: the others wait and get it.
func (m *Manager) Build(ctx context.Context) (*Volume, error) {
	if err := m.made(); err != nil {
		return nil, err
	}
	version, err := m.DriverVersion(ctx)
	if err != nil {
		return nil, err
	}
	unlock, err := m.lock(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	dir := filepath.Join(m.cfg.root, Prefix+version)
	caps := m.cfg.caps
	mf, err := m.existing(dir)
	if err == nil && mf.Version != version {
		err = &DamagedError{Path: dir, Problems: []string{"manifest of driver " + mf.Version}}
	}
	if err == nil {
		// A rebuild keeps what the volume served: other managers may want it.
		caps = normalizeCapabilities(append(slices.Clone(caps), mf.Capabilities...))
	}
	switch {
	case err == nil && m.covers(mf):
		if err = mf.verify(dir, m.cfg.deepVerify); err == nil {
			return m.volume(dir, mf, false, nil)
		}
		m.cfg.logger.WarnContext(ctx, "rebuilding damaged volume", "path", dir, "error", err)
	case err == nil:
		m.cfg.logger.InfoContext(ctx, "rebuilding volume for more capabilities", "path", dir, "has", mf.Capabilities, "want", m.cfg.caps)
	case errors.Is(err, ErrUnsafe):
		return nil, err
	case !errors.Is(err, fs.ErrNotExist):
		m.cfg.logger.WarnContext(ctx, "rebuilding unreadable volume", "path", dir, "error", err)
	}
	contents, err := m.contents(ctx, version, caps)
	if err != nil {
		return nil, err
	}
	mf, err = m.build(ctx, dir, contents)
	if err != nil {
		return nil, err
	}
	m.cfg.logger.InfoContext(ctx, "built volume", "path", dir, "files", len(mf.Files), "links", len(mf.Links))
	return m.volume(dir, mf, true, contents.Warnings)
}

// covers reports whether a volume with manifest mf serves every capability
// the manager is configured for.
func (m *Manager) covers(mf *Manifest) bool {
	for _, c := range m.cfg.caps {
		if !slices.Contains(mf.Capabilities, c) {
			return false
		}
	}
	return true
}

// existing checks the directory of a volume and reads its manifest. A path
// that does not exist gives fs.ErrNotExist; an unsafe one an *UnsafeError.
func (m *Manager) existing(dir string) (*Manifest, error) {
	fi, err := os.Lstat(dir)
	if err != nil {
		return nil, err
	}
	if err := m.checkDir(dir, fi); err != nil {
		return nil, err
	}
	return readManifest(dir)
}

// checkDir refuses a directory that is a symlink, or that someone other than
// the manager's user (root, when it runs as root) owns or may write to.
func (m *Manager) checkDir(p string, fi fs.FileInfo) error {
	if fi.Mode()&fs.ModeSymlink != 0 {
		return &UnsafeError{Path: p, Reason: "a symlink"}
	}
	if !fi.IsDir() {
		return &UnsafeError{Path: p, Reason: "not a directory"}
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return &UnsafeError{Path: p, Reason: fmt.Sprintf("writable by group or others (%v)", fi.Mode().Perm())}
	}
	if uid, ok := linux.Owner(fi); ok && int(uid) != m.cfg.owner {
		return &UnsafeError{Path: p, Reason: fmt.Sprintf("owned by uid %d, not %d", uid, m.cfg.owner)}
	}
	return nil
}

// build builds the volume of contents in a temporary directory beside dir,
// then puts it in place of dir in one step.
func (m *Manager) build(ctx context.Context, dir string, c *Contents) (*Manifest, error) {
	tmp, err := os.MkdirTemp(m.cfg.root, tmpPrefix+filepath.Base(dir)+"-")
	if err != nil {
		return nil, fmt.Errorf("build %s: %w", dir, err)
	}
	keep := false
	defer func() {
		if !keep {
			os.RemoveAll(tmp)
		}
	}()
	mf, err := m.fill(ctx, tmp, c)
	if err != nil {
		return nil, fmt.Errorf("build %s: %w", dir, err)
	}
	if err := os.Chmod(tmp, dirMode); err != nil {
		return nil, fmt.Errorf("build %s: %w", dir, err)
	}
	if err := m.install(tmp, dir); err != nil {
		return nil, fmt.Errorf("build %s: %w", dir, err)
	}
	keep = true
	return mf, nil
}

// install puts the built directory tmp in place of dir: an atomic exchange
// when dir exists (containers holding the old one keep it), else a rename.
func (m *Manager) install(tmp, dir string) error {
	if _, err := os.Lstat(dir); err == nil {
		err := linux.Exchange(tmp, dir)
		if errors.Is(err, linux.ErrNotSupported) {
			trash := filepath.Join(m.cfg.root, trashName+filepath.Base(tmp))
			if err := os.Rename(dir, trash); err != nil {
				return err
			}
			err = os.Rename(tmp, dir)
			tmp = trash
		}
		if err != nil {
			return err
		}
		// tmp now holds the old volume.
		if err := os.RemoveAll(tmp); err != nil {
			return err
		}
	} else if err := os.Rename(tmp, dir); err != nil {
		return err
	}
	return nil
}

// fill places the files and links of c under tmp, through an os.Root so
// that nothing is written outside tmp, and writes the manifest.
func (m *Manager) fill(ctx context.Context, tmp string, c *Contents) (*Manifest, error) {
	r, err := os.OpenRoot(tmp)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	for _, d := range []string{BinDir, LibDir, Lib64Dir} {
		if err := r.Mkdir(d, dirMode); err != nil {
			return nil, err
		}
		if err := r.Chmod(d, dirMode); err != nil { // whatever the umask
			return nil, err
		}
	}
	mf := &Manifest{Schema: manifestSchema, Version: c.Version, Capabilities: c.Capabilities, Links: c.Links}
	copied := false
	for _, f := range c.Files {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if !validVolumePath(f.Path) {
			return nil, fmt.Errorf("file %q: %w", f.Path, ErrInvalidName)
		}
		entry, err := m.place(r, tmp, f)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f.Path, err)
		}
		mf.Files = append(mf.Files, entry)
		copied = copied || !entry.Linked
	}
	for _, l := range c.Links {
		if !validName(l.Target) || !validVolumePath(l.Path) {
			return nil, fmt.Errorf("link %s -> %q: %w", l.Path, l.Target, ErrInvalidName)
		}
		if err := r.Symlink(l.Target, l.Path); err != nil {
			return nil, err
		}
	}
	if err := mf.seal(); err != nil {
		return nil, err
	}
	b, err := json.MarshalIndent(mf, "", "\t")
	if err != nil {
		return nil, err
	}
	out, err := r.OpenFile(ManifestName, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return nil, err
	}
	if _, err := out.Write(append(b, '\n')); err != nil {
		out.Close()
		return nil, err
	}
	if copied {
		err = out.Sync()
	}
	if err := errors.Join(err, out.Close()); err != nil {
		return nil, err
	}
	return mf, nil
}

// place hard-links f's source into the volume, or copies it when linking
// is off or fails (another file system), and describes the result.
func (m *Manager) place(r *os.Root, tmp string, f File) (ManifestFile, error) {
	entry := ManifestFile{File: f}
	linked := false
	if m.cfg.links {
		// tmp is this call's own fresh directory (mode 0700) and link(2)
		// never follows a symlink at its new path.
		linked = os.Link(f.Source, filepath.Join(tmp, filepath.FromSlash(f.Path))) == nil
	}
	if !linked {
		sum, err := copyFile(r, f)
		if err != nil {
			return entry, err
		}
		entry.CRC32C = sum
	}
	fi, err := r.Lstat(f.Path)
	if err != nil {
		return entry, err
	}
	entry.Size, entry.Mode, entry.ModTime = fi.Size(), fi.Mode(), fi.ModTime().UnixNano()
	if linked {
		entry.Linked = true
		entry.Dev, entry.Inode, _ = linux.Inode(fi)
	}
	return entry, nil
}

// copyFile copies f's source into r and returns the CRC-32C of the bytes.
func copyFile(r *os.Root, f File) (uint32, error) {
	src, err := os.Open(f.Source)
	if err != nil {
		return 0, err
	}
	defer src.Close()
	fi, err := src.Stat()
	if err != nil {
		return 0, err
	}
	mode := fi.Mode().Perm() & 0o755
	dst, err := r.OpenFile(f.Path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return 0, err
	}
	h := crc32.New(crc32.MakeTable(crc32.Castagnoli))
	_, err = io.CopyBuffer(io.MultiWriter(dst, h), src, make([]byte, copyBuffer))
	if err == nil {
		err = dst.Sync() // a copy's bytes are only on disk once synced
	}
	if err = errors.Join(err, dst.Close()); err != nil {
		return 0, err
	}
	if err := r.Chmod(f.Path, mode); err != nil { // whatever the umask
		return 0, err
	}
	return h.Sum32(), nil
}

// volume describes the volume at dir.
func (m *Manager) volume(dir string, mf *Manifest, built bool, warnings []string) (*Volume, error) {
	users, err := m.users(mf.Version)
	if err != nil {
		return nil, err
	}
	return &Volume{
		Version:      mf.Version,
		Path:         dir,
		Files:        len(mf.Files),
		Links:        len(mf.Links),
		Capabilities: slices.Clone(mf.Capabilities),
		Users:        users,
		Warnings:     warnings,
		Built:        built,
	}, nil
}

// volumeVersion returns the version a root entry names, if it names one.
func volumeVersion(name string) (string, bool) {
	v, ok := strings.CutPrefix(name, Prefix)
	return v, ok && ValidateVersion(v) == nil
}

// validVolumePath reports whether p names an entry of one of the volume's
// directories, such as "lib64/libcuda.so.1".
func validVolumePath(p string) bool {
	dir, name, ok := strings.Cut(p, "/")
	return ok && (dir == BinDir || dir == LibDir || dir == Lib64Dir) && validName(name)
}

// mkdirAll makes dir, and its missing parents, with dirMode whatever the
// umask; an existing dir is left as it is (and checked by the caller).
func mkdirAll(dir string) error {
	if _, err := os.Lstat(dir); err == nil || !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := mkdirAll(filepath.Dir(dir)); err != nil {
		return err
	}
	if err := os.Mkdir(dir, dirMode); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil // made meanwhile by another: checked by the caller
		}
		return err
	}
	return os.Chmod(dir, dirMode)
}
