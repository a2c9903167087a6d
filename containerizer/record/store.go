package record

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/gpuiso/gpuiso/internal/linux"
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
	// its own. nil refuses such files as corrupt.
	Legacy func(b []byte) (Entry[T], error)
	// NoSync leaves out the syncs of a write and of a removal: the
	// replacement is atomic against the writer's death, not a machine
	// crash, after which the file may be empty (and reads as corrupt). It
	// is for entries that describe running processes, which no machine
	// crash outlives.
	NoSync bool
}

// Store is a directory of entries of type T, one file per key. Its
// methods are safe for concurrent use on distinct keys; writers of one
// key are serialised by the caller.
type Store[T any] struct {
	dir string
	o   Options[T]
}

// New returns the store of dir (which New neither reads nor makes).
// Options without a format, or with a version below 1, are an error
// matching ErrInvalidOptions. Only a store of an absolute dir writes,
// removes and cleans: one of a relative dir (or "", the working
// directory) serves Read, List, Exists and Parse, and refuses the rest
// with ErrInvalidOptions, so that no entry lands wherever the process
// happens to run.
func New[T any](dir string, o Options[T]) (*Store[T], error) {
	if o.Format == "" || o.Version < 1 {
		return nil, fmt.Errorf("record store %q: format %q, version %d: %w", dir, o.Format, o.Version, ErrInvalidOptions)
	}
	if o.Name != "" && (strings.ContainsAny(o.Name, "/\\\x00") || o.Name == "." || o.Name == ".." || len(o.Name) > MaxKeyLen) {
		return nil, fmt.Errorf("record store %q: file name %q: %w", dir, o.Name, ErrInvalidOptions)
	}
	return &Store[T]{dir: dir, o: o}, nil
}

// Dir is the store's directory.
func (s *Store[T]) Dir() string {
	if s == nil {
		return ""
	}
	return s.dir
}

// made refuses a store not made with New.
func (s *Store[T]) made() error {
	if s == nil || s.o.Format == "" {
		return ErrNotMade
	}
	return nil
}

// writable refuses a store not made with New, or whose directory is not
// absolute.
func (s *Store[T]) writable() error {
	if err := s.made(); err != nil {
		return err
	}
	if !filepath.IsAbs(s.dir) {
		return fmt.Errorf("record store %q: a directory that is not absolute is never written: %w", s.dir, ErrInvalidOptions)
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
	if s.o.Name != "" {
		return filepath.Join(s.dir, key, s.o.Name), nil
	}
	return filepath.Join(s.dir, key+ext), nil
}

const ext = ".json"

// wire is an entry as a file holds it.
type wire struct {
	Format   string          `json:"format"`
	Version  int             `json:"version"`
	Key      string          `json:"key"`
	Phase    Phase           `json:"phase"`
	Process  *node.Process   `json:"process,omitempty"`
	Data     json.RawMessage `json:"data"`
	Checksum string          `json:"checksum,omitempty"`
}

// sum is the SHA-256 of w with Checksum empty, Data compacted.
func (w wire) sum() (string, error) {
	w.Checksum = ""
	b, err := json.Marshal(w)
	if err != nil {
		return "", err
	}
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:]), nil
}

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
	if !e.Phase.valid() {
		return fmt.Errorf("record %s: phase %q: %w", e.Key, e.Phase, ErrInvalidEntry)
	}
	if e.Process != nil && !e.Process.Valid() {
		return fmt.Errorf("record %s: process %d started at %d: %w", e.Key, e.Process.Pid, e.Process.Start, ErrInvalidEntry)
	}
	b, err := s.encode(e)
	if err != nil {
		return fmt.Errorf("record %s: %w", e.Key, err)
	}
	if s.o.NoSync {
		err = linux.ReplaceFile(p, b, 0o600)
	} else {
		err = linux.WriteFileAtomic(p, "", b, 0o600, nil)
	}
	if err != nil {
		return pathErr("record "+e.Key, err)
	}
	return nil
}

func (s *Store[T]) encode(e Entry[T]) ([]byte, error) {
	data, err := json.Marshal(e.Data)
	if err != nil {
		return nil, err
	}
	w := wire{Format: s.o.Format, Version: s.o.Version, Key: e.Key, Phase: e.Phase, Process: e.Process, Data: data}
	if w.Checksum, err = w.sum(); err != nil {
		return nil, err
	}
	b, err := json.Marshal(w)
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// Read returns key's entry. A key without one is an error matching
// ErrNoRecord; a file that cannot be trusted (see Parse), or that records
// another key, is a *CorruptError.
func (s *Store[T]) Read(key string) (Entry[T], error) {
	p, err := s.Path(key)
	if err != nil {
		return Entry[T]{}, err
	}
	b, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return Entry[T]{}, fmt.Errorf("record %s: %w", key, ErrNoRecord)
	}
	if err != nil {
		return Entry[T]{}, fmt.Errorf("record %s: %w", key, err)
	}
	e, err := s.parse(b)
	if err != nil {
		return Entry[T]{}, &CorruptError{Path: p, Err: err}
	}
	if e.Key != key {
		return Entry[T]{}, &CorruptError{Path: p, Err: fmt.Errorf("records key %q", e.Key)}
	}
	return e, nil
}

// Parse reads the content of one file: an entry of the store's format, of
// a version it knows, with a known phase, a valid process (or none) and
// the checksum of what it holds; or, with Options.Legacy, a file of the
// user's old shape. It says nothing of which key the file belongs to.
// Content it refuses is an error matching ErrCorrupt.
func (s *Store[T]) Parse(b []byte) (Entry[T], error) {
	if err := s.made(); err != nil {
		return Entry[T]{}, err
	}
	e, err := s.parse(b)
	if err != nil {
		return Entry[T]{}, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	return e, nil
}

func (s *Store[T]) parse(b []byte) (Entry[T], error) {
	var w wire
	if err := json.Unmarshal(b, &w); err != nil {
		return Entry[T]{}, err
	}
	var e Entry[T]
	if w.Data == nil || w.Format != s.o.Format {
		if s.o.Legacy == nil {
			return Entry[T]{}, fmt.Errorf("format %q, want %q", w.Format, s.o.Format)
		}
		var err error
		if e, err = s.o.Legacy(b); err != nil {
			return Entry[T]{}, err
		}
	} else {
		if w.Version < 1 || w.Version > s.o.Version {
			return Entry[T]{}, fmt.Errorf("%s version %d, this store reads 1 to %d", w.Format, w.Version, s.o.Version)
		}
		sum, err := w.sum()
		if err != nil {
			return Entry[T]{}, err
		}
		if sum != w.Checksum {
			return Entry[T]{}, errors.New("checksum mismatch")
		}
		if err := json.Unmarshal(w.Data, &e.Data); err != nil {
			return Entry[T]{}, err
		}
		e.Key, e.Phase, e.Process, e.Version = w.Key, w.Phase, w.Process, w.Version
	}
	if !e.Phase.valid() {
		return Entry[T]{}, fmt.Errorf("unknown phase %q", e.Phase)
	}
	if e.Process != nil && !e.Process.Valid() {
		return Entry[T]{}, fmt.Errorf("process %d started at %d", e.Process.Pid, e.Process.Start)
	}
	if ValidKey(e.Key) != nil {
		return Entry[T]{}, fmt.Errorf("key %q", e.Key)
	}
	return e, nil
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
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("record %s: %w", key, err)
	}
	if s.o.NoSync {
		return nil
	}
	if err := linux.SyncDir(filepath.Dir(p)); err != nil && !errors.Is(err, fs.ErrNotExist) {
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
		if s.o.Name == "" {
			var ok bool
			if key, ok = strings.CutSuffix(key, ext); !ok || !e.Type().IsRegular() {
				continue
			}
		} else if !e.IsDir() {
			continue
		}
		if ValidKey(key) == nil && (s.o.Name == "" || s.Exists(key)) {
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
	if s.o.Name != "" {
		keys, err := s.List()
		if err != nil {
			return err
		}
		dirs = dirs[:0]
		for _, k := range keys {
			dirs = append(dirs, filepath.Join(s.dir, k))
		}
	}
	var errs []error
	for _, d := range dirs {
		entries, err := os.ReadDir(d)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, e := range entries {
			if n := e.Name(); s.temp(n) && e.Type().IsRegular() {
				if err := os.Remove(filepath.Join(d, n)); err != nil && !errors.Is(err, fs.ErrNotExist) {
					errs = append(errs, err)
				}
			}
		}
	}
	return errors.Join(errs...)
}

// temp tells whether name is a temporary file of a write of this store
// (".<file>.<random>.tmp" synced, ".<file>.<pid>.tmp" not).
func (s *Store[T]) temp(name string) bool {
	base := ext
	if s.o.Name != "" {
		base = s.o.Name
	}
	rest, ok := strings.CutPrefix(name, ".")
	return ok && strings.HasSuffix(name, ".tmp") && strings.Contains(rest, base+".")
}
