package record

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/gpuiso/gpuiso/node"
)

// Phase is how far the work an entry records got.
type Phase string

// Phases of an entry.
const (
	// Started: the work began and may hold what no caller knows of yet;
	// written before anything is taken.
	Started Phase = "started"
	// Completed: the work is done and its caller was told.
	Completed Phase = "completed"
)

func (p Phase) valid() bool { return p == Started || p == Completed }

// Entry is one record: what a store holds of one key.
type Entry[T any] struct {
	// Key names the entry in its store (a container id, a claim uid).
	Key string
	// Phase is Started or Completed.
	Phase Phase
	// Process is the process the entry belongs to (a container's init, a
	// holder of its GPUs), or nil where there is none.
	Process *node.Process
	// Version is the version the entry was written in: the store's
	// Options.Version on a write, the file's on a read (an Options.Legacy
	// reader gives the old file's).
	Version int
	// Data is what the user records.
	Data T
}

// Options configures a Store. Format and Version are required.
type Options[T any] struct {
	// Format names what the store holds ("gpuiso-dra-claim"): a file of
	// another format is not one of its entries.
	Format string
	// Version is the version of Data's shape, 1 or more. Entries are
	// written in it; files of a later version (written by a newer
	// program) are refused as corrupt rather than misread.
	Version int
	// Name, when set, keeps each key's entry in a directory of its own,
	// "<dir>/<key>/<Name>", which the caller makes and removes; "" keeps
	// it in "<dir>/<key>.json".
	Name string
	// Legacy, when set, reads a file that holds no entry of the store's
	// format: one written before the store, in the user's old shape. It
	// returns the entry the file means (its Key, Phase, Process, Version
	// and Data) or an error; the store then checks the entry as it checks
	// its own. An entry without a Key (an old shape that held none) gets
	// the key of the file read, where one is known (Store.Read, File.Read
	// and File.Decode; not Store.Parse or Codec.Decode). nil refuses such
	// files as corrupt.
	Legacy func(b []byte) (Entry[T], error)
	// Perm is the mode of the files written; 0 means 0600.
	Perm fs.FileMode
	// NoSync leaves out the syncs of a write and of a removal: the
	// replacement is atomic against the writer's death, not a machine
	// crash, after which the file may be empty (and reads as corrupt). It
	// is for entries that describe running processes, which no machine
	// crash outlives.
	NoSync bool
}

// perm is the mode of the files written.
func (o Options[T]) perm() fs.FileMode {
	if o.Perm == 0 {
		return 0o600
	}
	return o.Perm.Perm()
}

// Store is a directory of entries of type T, one file per key. Its
// methods are safe for concurrent use on distinct keys; writers of one
// key are serialised by the caller.
type Store[T any] struct {
	dir string
	c   Codec[T]
}

// New returns the store of dir (which New neither reads nor makes).
// Options without a format, or with a version below 1, are an error
// matching ErrInvalidOptions. Only a store of an absolute dir writes,
// removes and cleans: one of a relative dir (or "", the working
// directory) serves Read, List, Exists and Parse, and refuses the rest
// with ErrInvalidOptions, so that no entry lands wherever the process
// happens to run.
func New[T any](dir string, o Options[T]) (*Store[T], error) {
	if err := o.valid(); err != nil {
		return nil, fmt.Errorf("record store %q: %w", dir, err)
	}
	return &Store[T]{dir: dir, c: Codec[T]{o: o}}, nil
}

// Dir is the store's directory.
func (s *Store[T]) Dir() string {
	if s == nil {
		return ""
	}
	return s.dir
}

// Codec is the store's codec.
func (s *Store[T]) Codec() (*Codec[T], error) {
	if err := s.made(); err != nil {
		return nil, err
	}
	return &s.c, nil
}

// made refuses a store not made with New.
func (s *Store[T]) made() error {
	if s == nil {
		return ErrNotMade
	}
	return s.c.made()
}

// writable refuses a store not made with New, or whose directory is not
// absolute.
func (s *Store[T]) writable() error {
	if err := s.made(); err != nil {
		return err
	}
	return absolute(s.dir)
}

// absolute refuses a directory that is not absolute, where nothing is
// written.
func absolute(dir string) error {
	if !filepath.IsAbs(dir) {
		return fmt.Errorf("record store %q: a directory that is not absolute is never written: %w", dir, ErrInvalidOptions)
	}
	return nil
}

// pathErr wraps an error of the file system on path: a directory that is
// missing matches node.ErrNotFound.
func pathErr(what string, err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%s: %w: %w", what, node.ErrNotFound, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// MaxKeyLen is the longest key (and Options.Name) in bytes: with the
// name of its temporary file around it, it stays within the 255 bytes a
// file name may have.
const MaxKeyLen = 200

// ValidKey checks that key can name an entry: not empty, ".", "..", not
// beginning with a dot, without a path separator or NUL, and at most
// MaxKeyLen bytes. The error matches ErrInvalidKey.
func ValidKey(key string) error {
	if key == "" || strings.HasPrefix(key, ".") || strings.ContainsAny(key, "/\\\x00") || len(key) > MaxKeyLen {
		return fmt.Errorf("record key %q: %w", key, ErrInvalidKey)
	}
	return nil
}

// Path is the file of key's entry.
func (s *Store[T]) Path(key string) (string, error) {
	if err := s.made(); err != nil {
		return "", err
	}
	if err := ValidKey(key); err != nil {
		return "", err
	}
	if s.c.o.Name != "" {
		return filepath.Join(s.dir, key, s.c.o.Name), nil
	}
	return filepath.Join(s.dir, key+ext), nil
}

const ext = ".json"

// Write replaces e.Key's entry with e, in the store's version, atomically.
// A key that is not valid (ErrInvalidKey), a phase that is neither Started
// nor Completed or a process that is not valid (ErrInvalidEntry) is an
// error, and nothing is written. A directory (the store's, or the key's
// for a store with Options.Name) that does not exist is an error
// matching node.ErrNotFound.
func (s *Store[T]) Write(e Entry[T]) error {
	if err := s.writable(); err != nil {
		return err
	}
	p, err := s.Path(e.Key)
	if err != nil {
		return err
	}
	b, err := s.c.Encode(e)
	if err != nil {
		return err
	}
	if err := replacePath(p, b, s.c.o.perm(), !s.c.o.NoSync); err != nil {
		return pathErr("record "+e.Key, err)
	}
	return nil
}

// WriteIn is Write through dir, a handle on the directory that holds the
// entry's file (the key's directory for a store with Options.Name, the
// store's otherwise), opened before the writer lost the path to it (a
// process that left the file system that holds the store, say). The
// store's directory is not read, and need not be absolute.
func (s *Store[T]) WriteIn(dir *os.Root, e Entry[T]) error {
	if err := s.made(); err != nil {
		return err
	}
	p, err := s.Path(e.Key)
	if err != nil {
		return err
	}
	if dir == nil {
		return fmt.Errorf("record %s: no directory: %w", e.Key, ErrInvalidOptions)
	}
	b, err := s.c.Encode(e)
	if err != nil {
		return err
	}
	if err := replace(dir, filepath.Base(p), b, s.c.o.perm(), !s.c.o.NoSync); err != nil {
		return pathErr("record "+e.Key, err)
	}
	return nil
}

// Read returns key's entry. A key without one is an error matching
// ErrNoRecord; a file that cannot be trusted (see Parse), or that records
// another key, is a *CorruptError.
func (s *Store[T]) Read(key string) (Entry[T], error) {
	p, err := s.Path(key)
	if err != nil {
		return Entry[T]{}, err
	}
	return s.c.readFile(p, key)
}

// readFile reads the entry of key in the file at path.
func (c *Codec[T]) readFile(path, key string) (Entry[T], error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return Entry[T]{}, fmt.Errorf("record %s: %w", key, ErrNoRecord)
	}
	if err != nil {
		return Entry[T]{}, fmt.Errorf("record %s: %w", key, err)
	}
	e, err := c.decode(b, key)
	if err != nil {
		return Entry[T]{}, &CorruptError{Path: path, Err: err}
	}
	if e.Key != key {
		return Entry[T]{}, &CorruptError{Path: path, Err: fmt.Errorf("records key %q", e.Key)}
	}
	return e, nil
}

// Parse reads the content of one file as the store's Codec.Decode does.
// It says nothing of which key the file belongs to. Content it refuses
// is an error matching ErrCorrupt.
func (s *Store[T]) Parse(b []byte) (Entry[T], error) {
	if err := s.made(); err != nil {
		return Entry[T]{}, err
	}
	return s.c.Decode(b)
}

// Remove deletes key's entry; one already gone is not an error.
func (s *Store[T]) Remove(key string) error {
	if err := s.writable(); err != nil {
		return err
	}
	p, err := s.Path(key)
	if err != nil {
		return err
	}
	if err := removePath(p, !s.c.o.NoSync); err != nil {
		return fmt.Errorf("record %s: %w", key, err)
	}
	return nil
}

// Exists reports whether key has a file, whatever its content.
func (s *Store[T]) Exists(key string) bool {
	p, err := s.Path(key)
	if err != nil {
		return false
	}
	_, err = os.Lstat(p)
	return err == nil
}

// List returns the keys that have a file, whatever its content, sorted.
// A directory that does not exist is an error matching node.ErrNotFound.
func (s *Store[T]) List() ([]string, error) {
	if err := s.made(); err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, pathErr("records", err)
	}
	var out []string
	for _, e := range entries {
		key := e.Name()
		if s.c.o.Name == "" {
			var ok bool
			if key, ok = strings.CutSuffix(key, ext); !ok || !e.Type().IsRegular() {
				continue
			}
		} else if !e.IsDir() {
			continue
		}
		if ValidKey(key) == nil && (s.c.o.Name == "" || s.Exists(key)) {
			out = append(out, key)
		}
	}
	slices.Sort(out)
	return out, nil
}

// Clean removes the temporary files that writes cut short left in the
// store's directory (for a store with Options.Name, in each key's). Only
// the one writer of the store may call it: another's write in progress
// would lose its temporary file.
func (s *Store[T]) Clean() error {
	if err := s.writable(); err != nil {
		return err
	}
	dirs := []string{s.dir}
	if s.c.o.Name != "" {
		keys, err := s.List()
		if err != nil {
			return err
		}
		dirs = dirs[:0]
		for _, k := range keys {
			dirs = append(dirs, filepath.Join(s.dir, k))
		}
	}
	base := ext
	if s.c.o.Name != "" {
		base = s.c.o.Name
	}
	var errs []error
	for _, d := range dirs {
		errs = append(errs, cleanDir(d, func(name string) bool { return isTemp(name, base) }))
	}
	return errors.Join(errs...)
}

// cleanDir removes the regular files of dir that temp names.
func cleanDir(dir string, temp func(name string) bool) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		if n := e.Name(); temp(n) && e.Type().IsRegular() {
			if err := os.Remove(filepath.Join(dir, n)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// isTemp tells whether name is a temporary file of a write of a file
// named base, or of any file ending in base (".<file>.<pid>.<random>.tmp"
// synced, ".<file>.<pid>.tmp" not, and ".<file>.<random>.tmp" of the
// synced writes of earlier releases).
func isTemp(name, base string) bool {
	rest, ok := strings.CutPrefix(name, ".")
	return ok && strings.HasSuffix(name, ".tmp") && strings.Contains(rest, base+".")
}
