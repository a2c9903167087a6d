package record

import (
	"fmt"

	"github.com/gpuiso/gpuiso/node"
)

var (
	// ErrCorrupt: a record cannot be trusted (see CorruptError).
	ErrCorrupt = node.Sentinel(node.ErrCorrupt, "corrupt record")
	// ErrNoRecord: the store holds no record of that key.
	ErrNoRecord = node.Sentinel(node.ErrNotFound, "no record")
	// ErrInvalidKey: a key is empty, ".", "..", begins with a dot (the
	// store's temporary files do), holds a path separator or NUL, or is
	// longer than MaxKeyLen.
	ErrInvalidKey = node.Sentinel(node.ErrInvalid, "invalid record key")
	// ErrInvalidOptions: Options name no format, a version below 1, or a
	// Name that is no file name (".", "..", a path separator, NUL, longer
	// than MaxKeyLen); or a store whose directory is not absolute was
	// asked to write, remove or clean.
	ErrInvalidOptions = node.Sentinel(node.ErrInvalid, "invalid record store options")
	// ErrInvalidEntry: an entry to write has an unknown phase or a
	// process that is not valid.
	ErrInvalidEntry = node.Sentinel(node.ErrInvalid, "invalid record entry")
	// ErrNotMade: a Store not made with New (its zero value, or nil): it
	// refuses every call rather than write into the working directory.
	ErrNotMade = node.NotMade("record store not made with New")
)

// CorruptError is a record file that cannot be read as one: it does not
// parse, is of another format or a newer version, records another key,
// names an unknown phase or fails its checksum.
type CorruptError struct {
	// Path is the file's.
	Path string
	// Err is the reason.
	Err error
}

func (e *CorruptError) Error() string { return fmt.Sprintf("record %s: %v", e.Path, e.Err) }

// Is matches ErrCorrupt and node.ErrCorrupt.
func (e *CorruptError) Is(target error) bool {
	return target == ErrCorrupt || target == node.ErrCorrupt
}

// Unwrap returns the reason.
func (e *CorruptError) Unwrap() error { return e.Err }
