package cdi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	cdilib "tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/node"
)

// DefaultDir is the spec directory for specs that live as long as the node's
// current boot: CDI runtimes read it beside /etc/cdi, and a generated spec
// belongs there, not among an administrator's files.
const DefaultDir = "/var/run/cdi"

// Writer writes specs into a CDI spec directory, one file per kind,
// "<vendor>-<class>.json". Its zero value writes to DefaultDir.
//
// A write goes through a temporary file in the spec directory, named
// after the spec's file and the writing process. A writer killed in the
// middle leaves its temporary file behind: every write that changes a
// file, and Sweep, removes those of writers that no longer run.
type Writer struct {
	// Dir is the spec directory, an absolute path; "" means DefaultDir.
	// A relative one is refused (ErrInvalidDir): specs never go to the
	// working directory.
	Dir string
	// ProcRoot is where the proc file system is mounted, read to tell a
	// live writer of a temporary file from a dead one; "" means /proc.
	ProcRoot string
	// NoSync leaves out the syncs to disk of each write (removals are
	// still synced): a spec is replaced atomically against the writer's
	// death (a reader sees the old file or the new, never a part), not
	// the machine's (after a crash the file may be missing, empty or the
	// one before). It is for a directory emptied at boot (DefaultDir, a
	// tmpfs on most nodes) whose specs the caller writes again, from
	// records of its own, after a crash and before a runtime needs them.
	NoSync bool
}

// Result says what Write did.
type Result struct {
	// Path is the spec's file.
	Path string
	// Changed is false when the file already held the spec, byte for
	// byte, and was left untouched (content and modification time).
	Changed bool
	// Names are the fully qualified names ("<kind>=<device>") of the
	// devices the file defines, in the spec's order: the names a CDI
	// runtime resolves with it. For WriteAllocation, the one name of the
	// allocation's own device.
	Names []string
}

// Path is the file of kind's spec. A Dir that is not absolute is an
// error matching ErrInvalidDir.
func (w Writer) Path(kind string) (string, error) {
	dir, err := w.dir()
	if err != nil {
		return "", err
	}
	if err := ValidateKind(kind); err != nil {
		return "", err
	}
	vendor, class := parser.ParseQualifier(kind)
	return filepath.Join(dir, cdilib.GenerateSpecName(vendor, class)+".json"), nil
}

func (w Writer) dir() (string, error) {
	switch {
	case w.Dir == "":
		return DefaultDir, nil
	case !filepath.IsAbs(w.Dir):
		return "", fmt.Errorf("CDI spec directory %q: %w", w.Dir, ErrInvalidDir)
	}
	return w.Dir, nil
}

func (w Writer) procRoot() string {
	if w.ProcRoot == "" {
		return "/proc"
	}
	return w.ProcRoot
}

// Encode is the spec's file content: indented JSON and a final newline,
// the same bytes for the same spec.
func Encode(spec *specs.Spec) ([]byte, error) {
	b, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode CDI spec %s: %w", spec.Kind, err)
	}
	return append(b, '\n'), nil
}

// Write puts spec into its file in the spec directory (created if missing).
// A file that already holds exactly these bytes is not touched at all, so
// a second Write of an unchanged spec changes neither the content nor the
// modification time, and runtimes watching the directory see nothing.
// Otherwise the spec goes to a temporary file in the same directory, is
// synced, validated by the CDI library as a runtime would read it, and
// renamed over the file; the directory is synced last. A spec the library
// refuses gives a *SpecError and leaves the directory as it was.
// Result.Names are the names of the spec's devices, as a runtime resolves
// them.
func (w Writer) Write(ctx context.Context, spec *specs.Spec) (Result, error) {
	if spec == nil {
		return Result{}, fmt.Errorf("write CDI spec: %w: nil spec", ErrInvalidSpec)
	}
	path, err := w.Path(spec.Kind)
	if err != nil {
		return Result{}, fmt.Errorf("write CDI spec: %w", err)
	}
	res, err := w.write(ctx, path, spec)
	if err != nil {
		return res, err
	}
	res.Names = specNames(spec)
	return res, nil
}

// AllocationPath is the file of owner's allocation spec of kind (see
// Render): "<vendor>-<class>_alloc-<owner>.json", beside kind's node spec.
func (w Writer) AllocationPath(kind, owner string) (string, error) {
	p, err := w.Path(kind)
	if err != nil {
		return "", err
	}
	if err := node.ValidateOwner(owner); err != nil {
		return "", err
	}
	return strings.TrimSuffix(p, ".json") + "_" + AllocationDevice(owner) + ".json", nil
}

// WriteAllocation writes owner's allocation spec (from Render) into
// AllocationPath, as Write writes a node's spec, and returns in
// Result.Names the name a CDI runtime is given for owner's container
// ("<kind>=alloc-<owner>"). A spec that does not define owner's device,
// AllocationDevice(owner) (one rendered for another owner, say), would
// leave that name resolving to nothing: it is refused (ErrInvalidSpec) and
// nothing is written.
func (w Writer) WriteAllocation(ctx context.Context, owner string, spec *specs.Spec) (Result, error) {
	if spec == nil {
		return Result{}, fmt.Errorf("write CDI spec: %w: nil spec", ErrInvalidSpec)
	}
	path, err := w.AllocationPath(spec.Kind, owner)
	if err != nil {
		return Result{}, fmt.Errorf("write CDI spec: %w", err)
	}
	if !slices.ContainsFunc(spec.Devices, func(d specs.Device) bool { return d.Name == AllocationDevice(owner) }) {
		return Result{Path: path}, fmt.Errorf("write CDI spec %s: %w: it does not define %s's device %s", path, ErrInvalidSpec, owner, AllocationDevice(owner))
	}
	res, err := w.write(ctx, path, spec)
	if err != nil {
		return res, err
	}
	vendor, class := parser.ParseQualifier(spec.Kind)
	res.Names = []string{parser.QualifiedName(vendor, class, AllocationDevice(owner))}
	return res, nil
}

// RemoveAllocation deletes owner's allocation spec of kind; a missing one
// is not an error.
func (w Writer) RemoveAllocation(ctx context.Context, kind, owner string) error {
	path, err := w.AllocationPath(kind, owner)
	if err != nil {
		return fmt.Errorf("remove CDI spec: %w", err)
	}
	return remove(ctx, path)
}

func (w Writer) write(ctx context.Context, path string, spec *specs.Spec) (Result, error) {
	res := Result{Path: path}
	data, err := Encode(spec)
	if err != nil {
		return res, err
	}
	if err := ctx.Err(); err != nil {
		return res, fmt.Errorf("write CDI spec %s: %w", path, err)
	}
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
		return res, nil
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return res, fmt.Errorf("write CDI spec %s: %w", path, err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return res, fmt.Errorf("write CDI spec %s: %w", path, err)
	}
	// What dead writers left goes first; failing to remove it does not
	// stop this write (Sweep reports it).
	sweep(filepath.Dir(path), w.procRoot())
	replace := writeAtomic
	if w.NoSync {
		replace = writeNoSync
	}
	if err := replace(path, tempPattern(path, w.procRoot()), data); err != nil {
		return res, fmt.Errorf("write CDI spec %s: %w", path, err)
	}
	res.Changed = true
	return res, nil
}

// tempPattern is the os.CreateTemp pattern of path's temporary file:
// ".<file>.<pid>.<start>.*.tmp", naming the writing process, so that a
// sweep tells a dead writer's file from a live one's. Where the proc file
// system cannot say the writer's start time, the file is marked
// "<pid>.0", which no sweep removes.
func tempPattern(path, procRoot string) string {
	mark := strconv.Itoa(os.Getpid()) + ".0"
	if self, err := linux.Self(procRoot); err == nil {
		mark = self.String()
	}
	return "." + filepath.Base(path) + "." + mark + ".*.tmp"
}

// deadTemp tells whether name is a temporary file of a spec write that
// no running process will finish: one marked with a writer that provably
// ended, or one of the unmarked form of earlier versions
// (".<file>.json.<random>.tmp"), which no writer of this one makes.
func deadTemp(name, procRoot string) bool {
	rest, ok := strings.CutPrefix(name, ".")
	if !ok {
		return false
	}
	rest, ok = strings.CutSuffix(rest, ".tmp")
	if !ok {
		return false
	}
	i := strings.LastIndex(rest, ".json.")
	if i < 0 {
		return false
	}
	parts := strings.Split(rest[i+len(".json."):], ".")
	for _, p := range parts {
		if p == "" || strings.Trim(p, "0123456789") != "" {
			return false
		}
	}
	switch len(parts) {
	case 1:
		return true
	case 3:
		p, err := linux.ParseProcess(parts[0] + "." + parts[1])
		return err == nil && linux.Dead(procRoot, p)
	}
	return false
}

// sweep removes the temporary files of dead writers from dir.
func sweep(dir, procRoot string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("sweep CDI spec directory: %w", err)
	}
	var errs []error
	for _, e := range entries {
		if !e.Type().IsRegular() || !deadTemp(e.Name(), procRoot) {
			continue
		}
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("sweep CDI spec directory: %w", err))
		}
	}
	return errors.Join(errs...)
}

// Sweep removes from the spec directory the temporary files that writers
// killed in the middle of a write left: those of processes that no longer
// run (and those of earlier versions, whose names name no process). A live
// writer's temporary file stays. Every write that changes a file sweeps
// too; Sweep is for an agent's start, before it writes anything. A
// directory that does not exist holds nothing to sweep.
func (w Writer) Sweep(ctx context.Context) error {
	dir, err := w.dir()
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("sweep CDI spec directory %s: %w", dir, err)
	}
	return sweep(dir, w.procRoot())
}

// specNames are the qualified names of spec's devices, in its order.
func specNames(spec *specs.Spec) []string {
	vendor, class := parser.ParseQualifier(spec.Kind)
	names := make([]string, 0, len(spec.Devices))
	for _, d := range spec.Devices {
		names = append(names, parser.QualifiedName(vendor, class, d.Name))
	}
	return names
}

// writeAtomic replaces path with data through a temporary file the CDI
// library validates as a runtime will read it.
func writeAtomic(path, pattern string, data []byte) error {
	return linux.WriteFileAtomic(path, pattern, data, 0o644, func(tmp string) error {
		if _, err := cdilib.ReadSpec(tmp, 0); err != nil {
			return &SpecError{Path: path, Err: err}
		}
		return nil
	})
}

// writeNoSync is writeAtomic without the syncs (Writer.NoSync): a
// temporary file, validated, renamed over path.
func writeNoSync(path, pattern string, data []byte) (err error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), pattern)
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
		err = tmp.Chmod(0o644)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if _, err := cdilib.ReadSpec(tmp.Name(), 0); err != nil {
		return &SpecError{Path: path, Err: err}
	}
	return os.Rename(tmp.Name(), path)
}

// Remove deletes kind's spec file; a missing one is not an error.
func (w Writer) Remove(ctx context.Context, kind string) error {
	path, err := w.Path(kind)
	if err != nil {
		return fmt.Errorf("remove CDI spec: %w", err)
	}
	return remove(ctx, path)
}

func remove(ctx context.Context, path string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("remove CDI spec %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove CDI spec %s: %w", path, err)
	}
	return linux.SyncDir(filepath.Dir(path))
}

// ValidateFile reads the spec file at path as a CDI runtime would, with the
// CDI library, and returns it. A file that does not parse or validate
// gives a *SpecError; a missing one an error matching node.ErrNotFound;
// one that cannot be read otherwise, the read error.
func ValidateFile(path string) (*specs.Spec, error) {
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("validate CDI spec: %w: %w", node.ErrNotFound, err)
	} else if err != nil {
		return nil, fmt.Errorf("validate CDI spec: %w", err)
	}
	s, err := cdilib.ReadSpec(path, 0)
	if err != nil {
		return nil, &SpecError{Path: path, Err: err}
	}
	return s.Spec, nil
}
