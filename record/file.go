package record

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// File is one entry in a file of its own, at a path its caller names (the
// allocator's state, a daemon's record in the daemon's directory): a
// store of one key. Its entries are written, read and checked as a
// Store's are; a file that records another key is corrupt.
type File[T any] struct {
	path string
	key  string
	c    Codec[T]
}

// NewFile returns the file at path, which holds key's entry (NewFile
// neither reads nor makes it). Options that New refuses, or that name a
// Name (a File is one file already), are an error matching
// ErrInvalidOptions; a key that is not valid, ErrInvalidKey. As with a
// Store, only a file of an absolute path is written or removed.
func NewFile[T any](path, key string, o Options[T]) (*File[T], error) {
	if err := o.valid(); err != nil {
		return nil, fmt.Errorf("record file %q: %w", path, err)
	}
	if o.Name != "" {
		return nil, fmt.Errorf("record file %q: a file takes no Name (%q): %w", path, o.Name, ErrInvalidOptions)
	}
	if !validName(filepath.Base(path)) || strings.HasSuffix(path, "/") {
		return nil, fmt.Errorf("record file %q: no file name: %w", path, ErrInvalidOptions)
	}
	if err := ValidKey(key); err != nil {
		return nil, fmt.Errorf("record file %q: %w", path, err)
	}
	return &File[T]{path: path, key: key, c: Codec[T]{o: o}}, nil
}

// made refuses a File not made with NewFile.
func (f *File[T]) made() error {
	if f == nil {
		return ErrNotMade
	}
	return f.c.made()
}

// Path is the file's path.
func (f *File[T]) Path() string {
	if f == nil {
		return ""
	}
	return f.path
}

// Key is the key of the file's entry.
func (f *File[T]) Key() string {
	if f == nil {
		return ""
	}
	return f.key
}

// Codec is the file's codec.
func (f *File[T]) Codec() (*Codec[T], error) {
	if err := f.made(); err != nil {
		return nil, err
	}
	return &f.c, nil
}

// entry gives e the file's key when it has none, and refuses another.
func (f *File[T]) entry(e Entry[T]) (Entry[T], error) {
	if e.Key == "" {
		e.Key = f.key
	}
	if e.Key != f.key {
		return e, fmt.Errorf("record file %s holds key %q, not %q: %w", f.path, f.key, e.Key, ErrInvalidEntry)
	}
	return e, nil
}

// Encode returns the content of the file holding e, as Codec.Encode does;
// an entry without a key gets the file's, one of another key is refused
// (ErrInvalidEntry).
func (f *File[T]) Encode(e Entry[T]) ([]byte, error) {
	if err := f.made(); err != nil {
		return nil, err
	}
	e, err := f.entry(e)
	if err != nil {
		return nil, err
	}
	return f.c.Encode(e)
}

// Write replaces the file with e, atomically, as Store.Write does; an
// entry without a key gets the file's, one of another key is refused
// (ErrInvalidEntry) and nothing is written.
func (f *File[T]) Write(e Entry[T]) error {
	b, err := f.Encode(e)
	if err != nil {
		return err
	}
	return f.Replace(b)
}

// Replace replaces the file with b, the content Encode returned (for a
// caller that keeps what it wrote), atomically as Write does. Content
// that is not an entry of the file's key is refused (ErrInvalidEntry) and
// nothing is written.
func (f *File[T]) Replace(b []byte) error {
	if err := f.made(); err != nil {
		return err
	}
	if err := absolute(filepath.Dir(f.path)); err != nil {
		return err
	}
	if e, err := f.c.decode(b, ""); err != nil || e.Key != f.key {
		return fmt.Errorf("record file %s: content that is no entry of key %q: %w", f.path, f.key, ErrInvalidEntry)
	}
	if err := replacePath(f.path, b, f.c.o.perm(), !f.c.o.NoSync); err != nil {
		return pathErr("record "+f.key, err)
	}
	return nil
}

// WriteIn is Write through dir, a handle on the file's directory opened
// before the writer lost the path to it (a process that left the file
// system that holds the file, say). The path's directory is not read, and
// need not be absolute.
func (f *File[T]) WriteIn(dir *os.Root, e Entry[T]) error {
	b, err := f.Encode(e)
	if err != nil {
		return err
	}
	if dir == nil {
		return fmt.Errorf("record file %s: no directory: %w", f.path, ErrInvalidOptions)
	}
	if err := replace(dir, filepath.Base(f.path), b, f.c.o.perm(), !f.c.o.NoSync); err != nil {
		return pathErr("record "+f.key, err)
	}
	return nil
}

// Read returns the file's entry. A file that does not exist is an error
// matching ErrNoRecord; one that cannot be trusted (see Codec.Decode), or
// that records another key, is a *CorruptError.
func (f *File[T]) Read() (Entry[T], error) {
	if err := f.made(); err != nil {
		return Entry[T]{}, err
	}
	return f.c.readFile(f.path, f.key)
}

// Decode reads b as the file's content: an error matching ErrCorrupt
// where Read's would be a *CorruptError.
func (f *File[T]) Decode(b []byte) (Entry[T], error) {
	if err := f.made(); err != nil {
		return Entry[T]{}, err
	}
	e, err := f.c.decode(b, f.key)
	if err != nil {
		return Entry[T]{}, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	if e.Key != f.key {
		return Entry[T]{}, fmt.Errorf("%w: records key %q, not %q", ErrCorrupt, e.Key, f.key)
	}
	return e, nil
}

// Exists reports whether the file exists, whatever its content.
func (f *File[T]) Exists() bool {
	if f.made() != nil {
		return false
	}
	_, err := os.Lstat(f.path)
	return err == nil
}

// Remove deletes the file; one already gone is not an error.
func (f *File[T]) Remove() error {
	if err := f.made(); err != nil {
		return err
	}
	if err := absolute(filepath.Dir(f.path)); err != nil {
		return err
	}
	if err := removePath(f.path, !f.c.o.NoSync); err != nil {
		return fmt.Errorf("record %s: %w", f.key, err)
	}
	return nil
}

// Clean removes the temporary files that writes of the file cut short
// left in its directory. Only the file's one writer may call it: another
// writer's write in progress would lose its temporary file.
func (f *File[T]) Clean() error {
	if err := f.made(); err != nil {
		return err
	}
	dir := filepath.Dir(f.path)
	if err := absolute(dir); err != nil {
		return err
	}
	return cleanDir(dir, func(name string) bool { return isTemp(name, filepath.Base(f.path)) })
}
