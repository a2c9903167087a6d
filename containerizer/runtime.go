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

// Maker is a Runtime that tells whether it was made by its constructor:
// NewLifecycle refuses one that was not (its zero value, or a typed nil)
// with ErrNotMade, where calling it would panic.
type Maker interface {
	Made() bool
}

// Updater is a Runtime that can change a running container's GPUs; a
// Lifecycle over another refuses Update with ErrNotSupported.
type Updater interface {
	// Update changes rec's container to gpus GPUs, the allocation in alloc
	// (the Lifecycle's one allocator) with it, and returns its record; on
	// error it keeps what it had.
	Update(ctx context.Context, alloc *allocator.Allocator, rec Record, gpus int) (Record, error)
}

// Repairer is an Updater whose containers a process killed inside Update
// can leave allowed, or recorded with, other GPUs than the allocator holds
// for them (see Resize: the allocator is the record of what a container
// holds, the container's own record follows it). Recover has it bring every
// container it adopts in line with the allocator.
type Repairer interface {
	// Repair makes rec's container reach exactly what alloc holds for its
	// owner (nothing, when it holds nothing): its device nodes and device
	// rules (and CPUs) where it still runs, then its record; it returns
	// the record.
	Repair(ctx context.Context, alloc *allocator.Allocator, rec Record) (Record, error)
}

// UsageReader is a Runtime that reports what a container's processes use
// of its GPUs (Lifecycle.Usage).
type UsageReader interface {
	// Usage reads the use of rec's GPUs by its container's processes.
	Usage(ctx context.Context, rec Record) (node.Usage, error)
}

// TempDirMaker is a Runtime that makes directories for its process's own
// use, which a recovery removes once that process has died
// (Lifecycle.TempDir).
type TempDirMaker interface {
	// TempDir makes a new directory and returns its path.
	TempDir() (string, error)
}

// Supervised is a Runtime that names the supervisor of its containers
// itself (the process whose death ends them; nil for none): the native
// runtime, whose containers' inits are children of the process that runs
// it. A Lifecycle records it for the runtime's containers, holds their
// GPUs with it and recovers them by it, in place of
// LifecycleConfig.Supervisor (which, when set, must be the same).
type Supervised interface {
	// Supervisor is the supervisor of the runtime's containers, or nil.
	Supervisor() *allocator.Holder
}

// Reserver is a Runtime that durably reserves a container's id before the
// prepare step, so that a process killed anywhere between the reservation
// and the container's removal leaves something List finds (a record with
// Reserved set until Create has made the container) and the next recovery
// cleans up: the GPUs and the volume use the prepare step took for that
// owner are given back with it.
//
// For a Reserver, Remove leaves the reservation: the Lifecycle drops it
// with Unreserve once the container's GPUs and volume use are given back.
type Reserver interface {
	// Reserve marks spec.ID as taken by this runtime, durably, before
	// anything is held for it. An id already reserved or in use is refused
	// with an error matching ErrContainerExists. On error nothing is left.
	Reserve(ctx context.Context, spec Spec) error
	// Unreserve drops id's reservation; one already gone is not an error.
	Unreserve(ctx context.Context, id string) error
}

// Adopter is a Runtime that records who supervises a container it keeps:
// when Recover adopts a container whose supervisor died, a Lifecycle with
// a Supervisor of its own takes the container over, and Adopt records that
// supervisor on the runtime's side. Other runtimes keep their records as
// they are.
type Adopter interface {
	// Adopt records sup as rec's supervisor and returns the record.
	Adopt(ctx context.Context, rec Record, sup allocator.Holder) (Record, error)
}

// Cleaner is a Runtime that keeps things beside its containers that can
// outlive the processes that made them (cgroups no record explains, the
// temporary directories of dead processes). Recover and Clean call Sweep
// once they have dealt with the containers.
type Cleaner interface {
	// Sweep removes the runtime's leftovers that no container explains.
	// It never touches what a live process (another's or this one's) may
	// still use. Errors are joined: one leftover does not keep the others.
	Sweep(ctx context.Context, s Sweep) error
}

// Sweep tells a Cleaner what the recovery that calls it did.
type Sweep struct {
	// Adopting is true after Recover, which adopts the containers of dead
	// supervisors (their leftovers may still be in use by them), false
	// after Clean, which removed them.
	Adopting bool
	// Failed is true when the recovery could not remove or adopt every
	// container of a dead supervisor: then the leftovers of dead processes
	// may still be used by a container of theirs.
	Failed bool
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
	// Share is the share of its one GPU it holds (a memory share or a time
	// slice), or nil for whole GPUs and MIG devices: what a recovery claims
	// again (allocator.Claim with AsShare) and gives its MPS daemon.
	Share *allocator.Share `json:"share,omitempty"`
	// Volume is the host path of its driver volume, VolumeVersion the
	// driver version; both empty for none.
	Volume        string `json:"volume,omitempty"`
	VolumeVersion string `json:"volumeVersion,omitempty"`
	// Pid is its first process, where the runtime knows it.
	Pid int `json:"pid,omitempty"`
	// Supervisor is the process that runs it and whose death ends it, or
	// nil (see LifecycleConfig.Supervisor).
	Supervisor *allocator.Holder `json:"supervisor,omitempty"`
	// Exit is how its command ended, nil while it runs: as List finds it,
	// or as the Lifecycle learnt it (Wait).
	Exit *ExitStatus `json:"exit,omitempty"`
	// Reserved says the id is reserved (Reserver) and the container is not
	// made yet (List only): a launch in progress, or one a killed process
	// left, which the recoveries remove.
	Reserved bool `json:"reserved,omitempty"`
	// Err says why the runtime cannot read the container's record (List
	// only): such a container is left alone.
	Err error `json:"-"`
}
