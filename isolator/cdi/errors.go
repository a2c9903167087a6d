package cdi

import (
	"fmt"

	"github.com/gpuiso/gpuiso/node"
)

var (
	// ErrInvalidKind: a CDI kind is not "vendor/class" with valid names.
	ErrInvalidKind = node.Sentinel(node.ErrInvalid, "invalid CDI kind")
	// ErrInvalidSpec: a spec does not pass the CDI library's validation.
	ErrInvalidSpec = node.Sentinel(node.ErrInvalid, "invalid CDI spec")
	// ErrNoDevices: the node has no GPU to put in a spec (none, or none
	// healthy with a device node): CDI has no spec without devices.
	ErrNoDevices = node.Sentinel(node.ErrNotFound, "no GPU for a CDI spec")
	// ErrUnresolvable: a name asked for would resolve to no device of the
	// spec it is meant for (a GPU without a UUID, which New leaves out).
	ErrUnresolvable = node.Sentinel(node.ErrNotFound, "CDI name resolves to no device")
	// ErrInvalidDir: a Writer's Dir is not an absolute path.
	ErrInvalidDir = node.Sentinel(node.ErrInvalid, "CDI spec directory not absolute")
)

// KindError is a CDI kind that cannot name a device class.
type KindError struct {
	// Kind is the kind as given.
	Kind string
	// Reason says what is wrong.
	Reason string
}

func (e *KindError) Error() string {
	return fmt.Sprintf("CDI kind %q: %s", e.Kind, e.Reason)
}

// Is matches ErrInvalidKind and node.ErrInvalid.
func (e *KindError) Is(target error) bool {
	return target == ErrInvalidKind || target == node.ErrInvalid
}

// SpecError is a spec the CDI library refused.
type SpecError struct {
	// Path is the file the spec was read from or was to be written to.
	Path string
	// Err is the library's reason.
	Err error
}

func (e *SpecError) Error() string {
	return fmt.Sprintf("CDI spec %s: %v", e.Path, e.Err)
}

// Unwrap returns the library's reason.
func (e *SpecError) Unwrap() error { return e.Err }

// Is matches ErrInvalidSpec and node.ErrInvalid.
func (e *SpecError) Is(target error) bool {
	return target == ErrInvalidSpec || target == node.ErrInvalid
}
