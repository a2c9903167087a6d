package rootfs

import (
	"errors"
	"fmt"

	"github.com/gpuiso/gpuiso/node"
)

var (
	// ErrFormat: the source is not an image this package reads, or it is
	// corrupt or truncated (a bad tar header, a bad gzip stream).
	ErrFormat = node.Sentinel(node.ErrInvalid, "not an OCI image layout or docker save archive")
	// ErrNotEmpty: the destination already holds files.
	ErrNotEmpty = node.Sentinel(node.ErrExists, "destination is not empty")
	// ErrLimit: the image is larger than the [Limits] allow. A *[LimitError]
	// says which limit.
	ErrLimit = node.Sentinel(node.ErrInvalid, "image exceeds an unpack limit")
	// ErrUnsafe: an entry would reach out of the root file system: a name
	// that climbs above it, a hard link to a file it did not unpack, a
	// whiteout naming "." or "..".
	ErrUnsafe = node.Sentinel(node.ErrInvalid, "entry leaves the root file system")
	// ErrInvalidOption: an [Option] was given a value it cannot take.
	ErrInvalidOption = node.Sentinel(node.ErrInvalid, "invalid unpack option")
)

// LayerError is a layer that could not be applied. It adds the layer's
// name to its cause and matches what the cause matches (ErrUnsafe,
// ErrLimit, a context's error, ...).
type LayerError struct {
	Layer string // the layer's path in the image
	Err   error
}

func (e *LayerError) Error() string { return fmt.Sprintf("layer %s: %v", e.Layer, e.Err) }

func (e *LayerError) Unwrap() error { return e.Err }

// LimitError is a limit the image went past. It matches [ErrLimit].
type LimitError struct {
	Limit string // "bytes", "entries" or "ratio": the Limits field
	Max   int64  // the limit in force
}

func (e *LimitError) Error() string {
	switch e.Limit {
	case "bytes":
		return fmt.Sprintf("image exceeds the unpack limit of %d bytes (Limits.Bytes)", e.Max)
	case "entries":
		return fmt.Sprintf("image exceeds the unpack limit of %d archive entries (Limits.Entries)", e.Max)
	case "ratio":
		return fmt.Sprintf("compressed layer expands more than %d times its size (Limits.Ratio)", e.Max)
	}
	return fmt.Sprintf("image exceeds the unpack limit of %d %s", e.Max, e.Limit)
}

// Is makes errors.Is(err, ErrLimit) and errors.Is(err, node.ErrInvalid)
// hold.
func (e *LimitError) Is(target error) bool { return errors.Is(ErrLimit, target) }
