package containerizer

import (
	"errors"
	"fmt"

	"github.com/gpuiso/gpuiso/node"
)

// ErrNotAdopted: a container its runtime lists cannot be adopted (its
// record does not read, its owner has another container, or its GPUs are
// held by another owner). It is left alone, with what its owner holds,
// until Destroy of its id removes it.
var ErrNotAdopted = node.Sentinel(node.ErrInvalid, "container cannot be adopted")

// NotAdoptedError is why a container a runtime lists could not be adopted
// (Recover) or have its GPUs claimed (Clean). It matches ErrNotAdopted and
// its kind, node.ErrInvalid, and no other kind of node's vocabulary: its
// cause (Err) is reached with errors.Is and errors.As for the cause's own
// errors (allocator.ErrDeviceUnavailable, ErrContainerExists, a
// *record.CorruptError), never for their kinds, so that one check routes
// it.
type NotAdoptedError struct {
	// ID is the container's id ("" when its record does not name one),
	// RuntimeID its runtime's name of it, Kind its runtime's kind.
	ID, RuntimeID string
	Kind          Kind
	// Err is why.
	Err error
}

func (e *NotAdoptedError) Error() string {
	name := e.ID
	if name == "" || (e.RuntimeID != "" && e.RuntimeID != e.ID) {
		name = fmt.Sprintf("%s (%s)", e.ID, e.RuntimeID)
	}
	return fmt.Sprintf("%s container %s: %s: %v", e.Kind, name, ErrNotAdopted, e.Err)
}

// Is makes errors.Is(err, ErrNotAdopted) and errors.Is(err,
// node.ErrInvalid) hold.
func (e *NotAdoptedError) Is(target error) bool {
	return target == ErrNotAdopted || target == node.ErrInvalid
}

// Unwrap returns the cause, less its kinds.
func (e *NotAdoptedError) Unwrap() error {
	if e.Err == nil {
		return nil
	}
	return kindless{e.Err}
}

// kindless is an error's chain without node's kinds: errors.Is finds in
// it every error but those, errors.As every type.
type kindless struct{ err error }

func (k kindless) Error() string { return k.err.Error() }

func (k kindless) Is(target error) bool { return !isKind(target) && errors.Is(k.err, target) }

func (k kindless) As(target any) bool { return errors.As(k.err, target) }

// isKind tells whether err is one of node's kinds.
func isKind(err error) bool {
	switch err {
	case node.ErrNotSupported, node.ErrInvalid, node.ErrExists, node.ErrNotFound, node.ErrInsufficient, node.ErrUnavailable, node.ErrCorrupt:
		return true
	}
	return false
}
