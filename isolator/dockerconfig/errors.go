package dockerconfig

import (
	"errors"
	"fmt"

	"github.com/gpuiso/gpuiso/node"
)

var (
	// ErrInvalidPlan: a plan cannot be expressed as a Docker configuration
	// (a device without a host path, a mount Docker cannot make).
	ErrInvalidPlan = node.Sentinel(node.ErrInvalid, "invalid plan for docker")
	// ErrInvalidLabels: a container's gpuiso labels are missing or do not
	// parse.
	ErrInvalidLabels = node.Sentinel(node.ErrInvalid, "invalid gpuiso labels")
	// ErrNilConfig: Apply was given no container configuration to edit.
	ErrNilConfig = node.Sentinel(node.ErrInvalid, "nil container configuration")
)

// LabelError is a container label that does not say what gpuiso wrote.
type LabelError struct {
	// Label is the label's key; Value what it holds.
	Label, Value string
	// Reason says what is wrong.
	Reason string
}

func (e *LabelError) Error() string {
	return fmt.Sprintf("label %s=%q: %s", e.Label, e.Value, e.Reason)
}

// Is matches ErrInvalidLabels and node.ErrInvalid.
func (e *LabelError) Is(target error) bool { return errors.Is(ErrInvalidLabels, target) }
