package containerizer

import (
	"context"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/node"
)

// Runtime is what a back end does for a Lifecycle: it runs containers,
// and the lifecycle decides everything else (states, the launches in
// progress, the prepare step, the allocator, recovery). A runtime keeps on
// its side (labels, records) what List needs to find a container again.
type Runtime interface {
	// Kind is the back end's kind.
	Kind() Kind
	// Image checks spec for this runtime and returns what its image tells
	// the prepare step. Nothing is made or held yet.
	Image(ctx context.Context, spec Spec) (Image, error)
	// Create makes spec's container with its prepared isolation, not
	// started, and returns its record. On error nothing is left.
	Create(ctx context.Context, spec Spec, p *Prepared) (Record, error)
	// Start starts a created container.
	Start(ctx context.Context, rec Record) error
	// Wait blocks until the container's command ends and returns how.
	Wait(ctx context.Context, rec Record) (ExitStatus, error)
	// Kill stops the container's processes, gracefully where the runtime
	// can; Destroy calls it before Remove for a container still running.
	Kill(ctx context.Context, rec Record) error
	// Remove removes what Create made, killing whatever still runs in it; a
	// container already gone is not an error.
	Remove(ctx context.Context, rec Record) error
	// List returns the records of the runtime's containers, running or
	// not. A container whose record cannot be read comes with Err set.
	List(ctx context.Context) ([]Record, error)
}

// Updater is a Runtime that can change a running container's GPUs; a
// Lifecycle over another refuses Update with ErrNotSupported.
type Updater interface {
	// Update changes rec's container to gpus GPUs, the allocation with it,
	// and returns its record; on error it keeps what it had.
	Update(ctx context.Context, rec Record, gpus int) (Record, error)
}

// Record is what a runtime keeps of a container: enough to find it again
// and to give back what it holds.
type Record struct {
	// ID is the container's id, the owner of its GPUs.
	ID string `json:"id"`
	// RuntimeID is the runtime's own name of it (a Docker container id).
	RuntimeID string `json:"runtimeId,omitempty"`
	// GPUs are the devices it was given.
	GPUs []node.DeviceRef `json:"gpus"`
	// Volume is the host path of its driver volume, VolumeVersion the
	// driver version; both empty for none.
	Volume        string `json:"volume,omitempty"`
	VolumeVersion string `json:"volumeVersion,omitempty"`
	// Pid is its first process, where the runtime knows it.
	Pid int `json:"pid,omitempty"`
	// Supervisor is the process that runs it and whose death ends it, or
	// nil (see LifecycleConfig.Supervisor).
	Supervisor *allocator.Holder `json:"supervisor,omitempty"`
	// Exit is how its command ended, nil while it runs (List only).
	Exit *ExitStatus `json:"exit,omitempty"`
	// Err says why the runtime cannot read the container's record (List
	// only): such a container is left alone.
	Err error `json:"-"`
}
