package simnode

import (
	"fmt"
	"strings"

	"github.com/gpuiso/gpuiso/node"
)

var (
	// ErrInvalidSpec: a topology description is malformed.
	ErrInvalidSpec = node.Sentinel(node.ErrInvalid, "invalid topology description")
	// ErrUnknownTopology: no shipped topology has that name.
	ErrUnknownTopology = node.Sentinel(node.ErrNotFound, "unknown topology")
	// ErrNoSuchGPU: an index names no GPU of the node.
	ErrNoSuchGPU = node.Sentinel(node.ErrNotFound, "no such GPU")
	// ErrNoSuchMIGDevice: no MIG device of the GPU has those instance ids.
	ErrNoSuchMIGDevice = node.Sentinel(node.ErrNotFound, "no such MIG device")
	// ErrRealDev: the simulated host's device nodes would land in the
	// host's real /dev, which the simulation never writes to.
	ErrRealDev = node.Sentinel(node.ErrInvalid, "refusing to create simulated device nodes in the real /dev")
	// ErrInvalidVersion: a driver version is not digits and dots.
	ErrInvalidVersion = node.Sentinel(node.ErrInvalid, "invalid driver version")
)

// UnknownTopologyError names a topology that is not shipped, and those that are.
type UnknownTopologyError struct {
	Name  string
	Known []string
}

func (e *UnknownTopologyError) Error() string {
	return fmt.Sprintf("unknown topology %q (shipped: %s)", e.Name, strings.Join(e.Known, ", "))
}

// Is makes errors.Is(err, ErrUnknownTopology) hold.
func (e *UnknownTopologyError) Is(target error) bool { return target == ErrUnknownTopology }
