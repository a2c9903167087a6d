package cgroups

import (
	"errors"
	"fmt"

	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/node"
)

// ErrVerify: the rules read back from the kernel differ from those written.
var ErrVerify = node.Sentinel(node.ErrCorrupt, "device rules read back differ from those applied")

// ErrNotMade: an Isolator was not made with New (its zero value): it
// refuses every call rather than touch paths relative to the working
// directory.
var ErrNotMade = node.NotMade("cgroups isolator not made with New")

// VerifyError carries what was applied and what the kernel holds.
type VerifyError struct {
	Owner string
	Want  []isolator.Rule
	Got   []isolator.Rule
}

func (e *VerifyError) Error() string {
	return fmt.Sprintf("container %s: device rules read back %v, applied %v", e.Owner, e.Got, e.Want)
}

// Is makes errors.Is(err, ErrVerify) and errors.Is(err, node.ErrCorrupt)
// hold.
func (e *VerifyError) Is(target error) bool { return errors.Is(ErrVerify, target) }
