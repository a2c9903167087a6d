package chain

import (
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/node"
)

var (
	// ErrNotMade: an Isolator was not made with New (its zero value); it
	// refuses every call.
	ErrNotMade = node.Sentinel(node.ErrInvalid, "gpu isolator not made with New")
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
	// ErrClosed: the isolator was closed; it refuses every call.
	ErrClosed = node.Sentinel(node.ErrInvalid, "gpu isolator closed")
	// ErrCorruptRecord: a container's record in the state directory cannot
	// be read back.
	ErrCorruptRecord = node.Sentinel(node.ErrCorrupt, "corrupt container record")
)
