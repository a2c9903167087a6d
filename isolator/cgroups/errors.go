package cgroups

import (
	"errors"
	"fmt"

	"github.com/gpuiso/gpuiso/isolator"
)

// ErrVerify: the rules read back from the kernel differ from those written.
var ErrVerify = errors.New("device rules read back differ from those applied")

// VerifyError carries what was applied and what the kernel holds.
type VerifyError struct {
	Owner string
	Want  []isolator.Rule
	Got   []isolator.Rule
}

func (e *VerifyError) Error() string {
	return fmt.Sprintf("container %s: device rules read back %v, applied %v", e.Owner, e.Got, e.Want)
}

// Is makes errors.Is(err, ErrVerify) hold.
func (e *VerifyError) Is(target error) bool { return target == ErrVerify }
