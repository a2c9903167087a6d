package ldcache

import (
	"errors"
	"fmt"

	"github.com/gpuiso/gpuiso/node"
)

var (
	// ErrInvalid: the data is not a readable ld.so.cache (truncated,
	// garbage, or offsets pointing outside the file). Its kind is
	// node.ErrInvalid.
	ErrInvalid = node.Sentinel(node.ErrInvalid, "invalid ld.so.cache")
	// ErrUnsupported: the data is an ld.so.cache in a layout this package
	// does not read (the old layout alone, or an unknown version). Its kind
	// is node.ErrNotSupported.
	ErrUnsupported = node.Sentinel(node.ErrNotSupported, "unsupported ld.so.cache layout")
)

// FormatError tells where and why a cache could not be read.
type FormatError struct {
	// Offset is the byte offset in the data where reading stopped.
	Offset int64
	// Reason says what was wrong there.
	Reason string
	// Unsupported is true when the data is a cache of a layout this package
	// does not read, rather than a broken one.
	Unsupported bool
}

func (e *FormatError) Error() string {
	return fmt.Sprintf("ld.so.cache at offset %d: %s", e.Offset, e.Reason)
}

// Is matches ErrUnsupported (and node.ErrNotSupported) for a cache of an
// unread layout and ErrInvalid (and node.ErrInvalid) for everything else.
func (e *FormatError) Is(target error) bool {
	if e.Unsupported {
		return errors.Is(ErrUnsupported, target)
	}
	return errors.Is(ErrInvalid, target)
}

func invalid(off int64, format string, args ...any) error {
	return &FormatError{Offset: off, Reason: fmt.Sprintf(format, args...)}
}
