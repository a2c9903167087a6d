package simnode

import (
	"errors"
	"fmt"
	"strings"
)

var (
	// ErrInvalidSpec: a topology description is malformed.
	ErrInvalidSpec = errors.New("invalid topology description")
	// ErrUnknownTopology: no shipped topology has that name.
	ErrUnknownTopology = errors.New("unknown topology")
	// ErrNoSuchGPU: an index names no GPU of the node.
	ErrNoSuchGPU = errors.New("no such GPU")
	// ErrNoSuchMIGDevice: no MIG device of the GPU has those instance ids.
	ErrNoSuchMIGDevice = errors.New("no such MIG device")
	// ErrRealDev: the simulated host's device nodes would land in the
	// host's real /dev, which the simulation never writes to.
	ErrRealDev = errors.New("refusing to create simulated device nodes in the real /dev")
	// ErrInvalidVersion: a driver version is not digits and dots.
	ErrInvalidVersion = errors.New("invalid driver version")
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
