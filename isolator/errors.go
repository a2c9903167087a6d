package isolator

import "github.com/gpuiso/gpuiso/node"

var (
	// ErrInvalidRule: a device rule is malformed.
	ErrInvalidRule = node.Sentinel(node.ErrInvalid, "invalid device rule")
	// ErrNotSupported: the host lacks what the back end needs (no cgroup
	// v2, no devices controller, not Linux, no permission for eBPF). It is
	// node.ErrNotSupported itself.
	ErrNotSupported = node.ErrNotSupported
	// ErrUnknownContainer: no container of that owner (id) exists in the
	// back end. It is the one such sentinel: containerizer's and
	// containerizer/chain's ErrUnknownContainer are this variable.
	ErrUnknownContainer = node.Sentinel(node.ErrNotFound, "unknown container")
	// ErrUnknownGPU: a plan names a GPU that is not a device of the node.
	ErrUnknownGPU = node.Sentinel(node.ErrInvalid, "not a GPU of this node")
	// ErrNoMIGCaps: a MIG device's capability nodes are unknown (discovery
	// found no nvidia-caps minors), so it cannot be isolated.
	ErrNoMIGCaps = node.Sentinel(node.ErrUnavailable, "MIG capability nodes unknown")
	// ErrUnknownNUMANode: a plan pinned to its GPUs' NUMA nodes names one
	// the host does not list (or one without CPUs), so it cannot be pinned.
	ErrUnknownNUMANode = node.Sentinel(node.ErrNotFound, "NUMA node not on this host")
	// ErrInvalidMPS: a plan's MPS daemon is malformed (relative
	// directories) or given to something other than one whole GPU.
	ErrInvalidMPS = node.Sentinel(node.ErrInvalid, "invalid MPS share")
)
