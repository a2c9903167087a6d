package chain

import (
	"fmt"

	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/node"
)

var (
	// ErrNotMade: an Isolator was not made with New (its zero value); it
	// refuses every call.
	ErrNotMade = node.NotMade("gpu isolator not made with New")
	// ErrUnknownContainer: the isolator prepared no container of that id
	// (or has cleaned it up). It is containerizer.ErrUnknownContainer.
	ErrUnknownContainer = containerizer.ErrUnknownContainer
	// ErrContainerExists: a container of that id is already prepared.
	ErrContainerExists = containerizer.ErrContainerExists
	// ErrInvalidCgroup: a cgroup given to IsolateCgroup is not a clean
	// relative path whose last element is a valid container name.
	ErrInvalidCgroup = node.Sentinel(node.ErrInvalid, "invalid cgroup path")
	// ErrStillRunning: Cleanup was asked for a container whose cgroup (one
	// the agent created) still holds processes: the agent destroys its
	// container before cleaning up after it.
	ErrStillRunning = node.Sentinel(node.ErrUnavailable, "container still has processes")
	// ErrInUse: another isolator holds the state directory.
	ErrInUse = node.Sentinel(node.ErrUnavailable, "state directory in use by another isolator")
	// ErrUnsafeLock: the state directory, or its lock file, could be
	// opened, listed or replaced by another user: the directory is another
	// user's, a link or writable by group or others, or the lock file is
	// not a regular file of the isolator's user with no permission for
	// group or others. See UnsafeLockError.
	ErrUnsafeLock = node.Sentinel(node.ErrCorrupt, "unsafe state directory lock")
	// ErrClosed: the isolator was closed; it refuses every call.
	ErrClosed = node.Sentinel(node.ErrInvalid, "gpu isolator closed")
	// ErrCorruptRecord: a container's record in the state directory cannot
	// be read back.
	ErrCorruptRecord = node.Sentinel(node.ErrCorrupt, "corrupt container record")
)

// UnsafeLockError is a state directory, or lock file, New refuses. It never
// changes such a file on its own: another user may hold it open, and its
// lock with it, whatever its mode becomes; whoever runs the agents removes
// it while none runs.
type UnsafeLockError struct {
	// Path is the lock file or the state directory.
	Path string
	// Reason says what is wrong with it.
	Reason string
}

func (e *UnsafeLockError) Error() string {
	return fmt.Sprintf("%s: %s: %s", e.Path, e.Reason, ErrUnsafeLock)
}

// Is makes errors.Is(err, ErrUnsafeLock) hold.
func (e *UnsafeLockError) Is(target error) bool {
	return target == ErrUnsafeLock || target == node.ErrCorrupt
}
