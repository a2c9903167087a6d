package record

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/gpuiso/gpuiso/node"
)

// Codec turns entries of one format into the bytes of a file and back:
// the envelope, its checksum, the versions it reads and the legacy reader
// of Options. A Store and a File write what it encodes; a caller that
// keeps the bytes it wrote (to tell later whether the file changed) uses
// it directly. Options.Name and Options.NoSync mean nothing to a Codec.
type Codec[T any] struct {
	o Options[T]
}

// NewCodec returns the codec of o. Options without a format, with a
// version below 1, or with a Name that is no file name are an error
// matching ErrInvalidOptions.
func NewCodec[T any](o Options[T]) (*Codec[T], error) {
	if err := o.valid(); err != nil {
		return nil, err
	}
	return &Codec[T]{o: o}, nil
}

// valid checks the options every maker checks.
func (o Options[T]) valid() error {
	if o.Format == "" || o.Version < 1 {
		return fmt.Errorf("record format %q, version %d: %w", o.Format, o.Version, ErrInvalidOptions)
	}
	if o.Name != "" && !validName(o.Name) {
		return fmt.Errorf("record file name %q: %w", o.Name, ErrInvalidOptions)
	}
	return nil
}

// validName tells whether name can name a file in a directory.
func validName(name string) bool {
	return name != "" && name != "." && name != ".." && !strings.ContainsAny(name, "/\\\x00") && len(name) <= MaxKeyLen
}

// made refuses a codec not made with NewCodec.
func (c *Codec[T]) made() error {
	if c == nil || c.o.Format == "" {
		return ErrNotMade
	}
	return nil
}

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

// check refuses an entry to write: a key that is not valid
// (ErrInvalidKey), a phase that is neither Started nor Completed or a
// process that is not valid (ErrInvalidEntry).
func check[T any](e Entry[T]) error {
	if err := ValidKey(e.Key); err != nil {
		return err
	}
	if !e.Phase.valid() {
		return fmt.Errorf("record %s: phase %q: %w", e.Key, e.Phase, ErrInvalidEntry)
	}
	if e.Process != nil && !e.Process.Valid() {
		return fmt.Errorf("record %s: process %d started at %d: %w", e.Key, e.Process.Pid, e.Process.Start, ErrInvalidEntry)
	}
	return nil
}

// Encode returns the content of e's file: e in the codec's format and
// version (e.Version is not read), with its checksum, and a newline. An
// entry Write would refuse (see Store.Write) is refused with the same
// error.
func (c *Codec[T]) Encode(e Entry[T]) ([]byte, error) {
	if err := c.made(); err != nil {
		return nil, err
	}
	if err := check(e); err != nil {
		return nil, err
	}
	data, err := json.Marshal(e.Data)
	if err != nil {
		return nil, fmt.Errorf("record %s: %w", e.Key, err)
	}
	w := wire{Format: c.o.Format, Version: c.o.Version, Key: e.Key, Phase: e.Phase, Process: e.Process, Data: data}
	if w.Checksum, err = w.sum(); err != nil {
		return nil, fmt.Errorf("record %s: %w", e.Key, err)
	}
	b, err := json.Marshal(w)
	if err != nil {
		return nil, fmt.Errorf("record %s: %w", e.Key, err)
	}
	return append(b, '\n'), nil
}

// Decode reads the content of one file: an entry of the codec's format,
// of a version it knows, with a known phase, a valid key and process (or
// none) and the checksum of what it holds; or, with Options.Legacy, a
// file of the user's old shape. It says nothing of which key the file
// belongs to. Content it refuses is an error matching ErrCorrupt.
func (c *Codec[T]) Decode(b []byte) (Entry[T], error) {
	if err := c.made(); err != nil {
		return Entry[T]{}, err
	}
	e, err := c.decode(b, "")
	if err != nil {
		return Entry[T]{}, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	return e, nil
}

// decode is Decode without the ErrCorrupt: the reason alone, for a
// CorruptError to carry. key is the key of the file read, where it is
// known: an entry of the Legacy reader without a key gets it.
func (c *Codec[T]) decode(b []byte, key string) (Entry[T], error) {
	var w wire
	if err := json.Unmarshal(b, &w); err != nil {
		return Entry[T]{}, err
	}
	var e Entry[T]
	if w.Data == nil || w.Format != c.o.Format {
		if c.o.Legacy == nil {
			return Entry[T]{}, fmt.Errorf("format %q, want %q", w.Format, c.o.Format)
		}
		var err error
		if e, err = c.o.Legacy(b); err != nil {
			return Entry[T]{}, err
		}
		if e.Key == "" {
			e.Key = key
		}
	} else {
		if w.Version < 1 || w.Version > c.o.Version {
			return Entry[T]{}, fmt.Errorf("%s version %d, this store reads 1 to %d", w.Format, w.Version, c.o.Version)
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
