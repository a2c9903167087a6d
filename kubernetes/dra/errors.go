package dra

import (
	"fmt"

	"github.com/gpuiso/gpuiso/isolator/mps"
	"github.com/gpuiso/gpuiso/node"
)

var (
	// ErrInvalidConfig: a Config field is missing or malformed.
	ErrInvalidConfig = node.Sentinel(node.ErrInvalid, "invalid DRA driver configuration")
	// ErrUnknownDevice: a claim names a device the node does not publish.
	ErrUnknownDevice = node.Sentinel(node.ErrNotFound, "unknown device")
	// ErrNotAllocated: a claim to prepare has no allocation.
	ErrNotAllocated = node.Sentinel(node.ErrInvalid, "claim not allocated")
	// ErrCorruptCheckpoint: a claim's checkpoint cannot be trusted.
	ErrCorruptCheckpoint = node.Sentinel(node.ErrCorrupt, "corrupt claim checkpoint")
)

// CheckpointError is a checkpoint file that cannot be read as one.
type CheckpointError struct {
	Path string
	Err  error
}

func (e *CheckpointError) Error() string {
	return fmt.Sprintf("claim checkpoint %s: %v", e.Path, e.Err)
}

// Is matches ErrCorruptCheckpoint and node.ErrCorrupt.
func (e *CheckpointError) Is(target error) bool {
	return target == ErrCorruptCheckpoint || target == node.ErrCorrupt
}

// Unwrap returns the reason.
func (e *CheckpointError) Unwrap() error { return e.Err }

var (
	// ErrInvalidShare: a share of a GPU was allocated without what it
	// needs (a share id, consumed memory), or configured with parameters
	// that do not read as a ShareConfig.
	ErrInvalidShare = node.Sentinel(node.ErrInvalid, "invalid GPU share")
	// ErrShareClaim: a claim asks for a share of a GPU beside other
	// devices of this driver (an owner holds one share, and a container
	// reaches one MPS daemon).
	ErrShareClaim = node.Sentinel(node.ErrNotSupported, "a claim of a GPU share holds no other device of the driver")
	// ErrNoMPS: a share of a GPU is to be prepared or rolled back, and the
	// driver has no MPS daemon manager.
	//
	// Deprecated: it is mps.ErrNoManager (and containerizer.ErrNoMPS), the
	// one value for a share without a daemon manager; match that.
	ErrNoMPS = mps.ErrNoManager
)

var (
	// ErrInvalidDeviceConfig: an opaque configuration of the driver does
	// not read as a GPUConfig or a ShareConfig, or does not hold for the
	// devices its request was allocated (a *ConfigError).
	ErrInvalidDeviceConfig = node.Sentinel(node.ErrInvalid, "invalid device configuration")
)

// ErrUntolerated: a claim's device is unhealthy and the claim does not
// tolerate its taint (or the driver publishes no taints), so it is not
// prepared.
var ErrUntolerated = node.Sentinel(node.ErrUnavailable, "unhealthy device, its taint not tolerated")
