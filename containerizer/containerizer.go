package containerizer

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/node"
)

// Containerizer runs containers with GPUs. Implementations: package native
// (a process in its own mount namespace and device cgroup) and package docker
// (a container of the Docker daemon); one Lifecycle over both runtimes puts
// both behind this one interface.
type Containerizer interface {
	// Launch allocates the container's GPUs, prepares its isolation and
	// starts it. On error nothing is left: no allocation, no cgroup, no
	// container.
	Launch(ctx context.Context, spec Spec) (Container, error)
	// Wait blocks until the container exits and returns its status.
	Wait(ctx context.Context, id string) (ExitStatus, error)
	// Update changes the number of GPUs of a running container.
	Update(ctx context.Context, id string, gpus int) (Container, error)
	// Destroy stops the container and releases everything it held. Destroying
	// a container that is already gone is not an error.
	Destroy(ctx context.Context, id string) error
	// Recover re-adopts the containers that survived a restart of the
	// containerizer (with their GPUs) and cleans up those that did not.
	Recover(ctx context.Context) ([]Container, error)
	// Containers lists the containers (copies).
	Containers() []Container
}

// Spec describes a container to launch.
type Spec struct {
	// ID names the container; it is also the owner of its GPUs in the
	// allocator (see node.ValidateOwner for what it may hold).
	ID string `json:"id"`
	// Image, when set, is a Docker image to run; empty means a native
	// container running Command on the host.
	Image string `json:"image,omitempty"`
	// Command is the program and its arguments; for an image it replaces
	// the image's CMD.
	Command []string `json:"command,omitempty"`
	// Env is added to the container's environment ("KEY=value").
	Env []string `json:"env,omitempty"`
	// Dir is the working directory of a native container.
	Dir string `json:"dir,omitempty"`
	// GPUs is what the container asks of the allocator: whole GPUs, MIG
	// devices, or a share of one GPU (GPUs.Share: a memory share, which
	// the back end's MPS daemon manager enforces, or a time slice).
	GPUs allocator.Request `json:"gpus"`
	// RootFS is a directory holding a native container's own root file
	// system, which the container pivots into; empty means the container
	// shares the host's (see package native for what it gets either way).
	RootFS string `json:"rootfs,omitempty"`
	// Labels are the labels of the image RootFS was unpacked from: with
	// RootFS and Env they decide whether a native container gets the driver
	// volume, as for a Docker image (volume.Image.NeedsVolume).
	Labels map[string]string `json:"labels,omitempty"`
	// User runs the command as this user and group instead of root.
	User *User `json:"user,omitempty"`
	// CapAdd adds capabilities ("SYS_PTRACE" or "CAP_SYS_PTRACE") to the
	// default set the command gets (Docker's).
	CapAdd []string `json:"capAdd,omitempty"`
	// Network is the container's network: NetworkPrivate (the default, its
	// own network namespace with only a loopback interface, as Docker's
	// "none") or NetworkHost (the host's, an explicit opt-in: the container
	// then reaches every listener and abstract socket of the host).
	Network Network `json:"network,omitempty"`
	// CPUAffinity pins the container to the CPUs and memory nodes local to
	// its GPUs (CPUAffinityNUMA) or not (CPUAffinityNone, the default):
	// see isolator.WithCPUAffinity. Native containers and the chain's
	// apply it with the cpuset controller, Docker ones through their
	// cpuset settings.
	CPUAffinity CPUAffinity `json:"cpuAffinity,omitempty"`
	// ExtraFiles are handed to a native container's command as descriptors
	// 3, 4, ...; nothing else the caller holds open crosses into it.
	ExtraFiles []*os.File `json:"-"`
	// Stdin feeds the container's standard input; nil means none.
	Stdin io.Reader `json:"-"`
	// Stdout and Stderr receive the container's output; nil discards it.
	// An *os.File is handed to the container as it is; any other writer is
	// fed by a goroutine, so it must be safe to use alongside the caller's
	// own writes.
	Stdout io.Writer `json:"-"`
	Stderr io.Writer `json:"-"`
}

// Network is the network a container is in.
type Network string

// Networks.
const (
	// NetworkPrivate is a network namespace of the container's own,
	// holding only a loopback interface.
	NetworkPrivate Network = ""
	// NetworkNone is NetworkPrivate by Docker's name.
	NetworkNone Network = "none"
	// NetworkHost is the host's network namespace.
	NetworkHost Network = "host"
)

// ParseNetwork reads a network name: "", "none" or "host".
func ParseNetwork(s string) (Network, error) {
	switch n := Network(s); n {
	case NetworkPrivate, NetworkNone, NetworkHost:
		return n, nil
	}
	return "", fmt.Errorf("%w: network %q: want none or host", ErrInvalidSpec, s)
}

// CPUAffinity is where a container's CPUs and memory come from.
type CPUAffinity string

// CPU affinities.
const (
	// CPUAffinityNone leaves the container the CPUs and memory nodes of
	// its cgroup parent (all of the host's, by default).
	CPUAffinityNone CPUAffinity = ""
	// CPUAffinityNUMA pins the container to the CPUs and memory nodes of
	// its GPUs' NUMA nodes (the union, for GPUs on several); a container
	// without GPUs, or with a GPU whose NUMA node is unknown, is not
	// pinned.
	CPUAffinityNUMA CPUAffinity = "numa"
)

// ParseCPUAffinity reads a CPU affinity by name: "numa", or "none" (or "")
// for none.
func ParseCPUAffinity(s string) (CPUAffinity, error) {
	switch s {
	case "", "none":
		return CPUAffinityNone, nil
	case string(CPUAffinityNUMA):
		return CPUAffinityNUMA, nil
	}
	return "", fmt.Errorf("%w: CPU affinity %q: want numa or none", ErrInvalidSpec, s)
}

// Kind is a containerizer back end.
type Kind string

// Kinds.
const (
	KindNative Kind = "native"
	KindDocker Kind = "docker"
)

// State is where a container is in its life (see Table for the changes
// allowed between states).
type State string

// States.
const (
	// StateLaunching: its launch is in progress; its id is reserved.
	StateLaunching State = "launching"
	// StateRunning: launched, its command has not ended (as far as the
	// back end knows).
	StateRunning State = "running"
	// StateExited: its command ended; it keeps what it holds until
	// destroyed.
	StateExited State = "exited"
	// StateDestroying: its destruction is in progress.
	StateDestroying State = "destroying"
)

// Container describes a launched container.
type Container struct {
	ID   string `json:"id"`
	Kind Kind   `json:"kind"`
	// GPUs are the devices the container owns.
	GPUs []node.DeviceRef `json:"gpus"`
	// Share is the share of its one GPU it holds, or nil (whole GPUs, MIG
	// devices).
	Share *allocator.Share `json:"share,omitempty"`
	// Volume is the host path of the driver volume mounted at
	// /usr/local/nvidia, or "" when the container has none.
	Volume string `json:"volume,omitempty"`
	// Pid is the host pid of a native container's first process.
	Pid int `json:"pid,omitempty"`
	// RuntimeID is the Docker container id.
	RuntimeID string `json:"runtimeId,omitempty"`
	State     State  `json:"state"`
}

// ExitStatus is how a container ended: its exit code, or 128+N when killed
// by signal N (as shells report it).
type ExitStatus struct {
	Code int `json:"code"`
}

var (
	// ErrUnknownContainer: no container has that id. It is
	// isolator.ErrUnknownContainer (one sentinel for every package that
	// knows containers by id), of kind node.ErrNotFound.
	ErrUnknownContainer = isolator.ErrUnknownContainer
	// ErrContainerExists: a container with that id already runs.
	ErrContainerExists = node.Sentinel(node.ErrExists, "container already exists")
	// ErrNotSupported: the back end cannot do what was asked (for instance,
	// Docker cannot change the devices of a running container). It is
	// node.ErrNotSupported, so one check covers every package's refusals.
	ErrNotSupported = node.ErrNotSupported
	// ErrInvalidSpec: a Spec is incomplete or contradicts itself.
	ErrInvalidSpec = node.Sentinel(node.ErrInvalid, "invalid container spec")
	// ErrNotMade: a containerizer was not made with its constructor (its
	// zero value), so it refuses every call.
	ErrNotMade = node.NotMade("containerizer not made with its constructor")
)
