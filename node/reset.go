package node

import (
	"context"
	"errors"
)

// Resetter resets a GPU, as a node's driver may offer: nvmlnode's
// SMIResetter through nvidia-smi, a simulated node (simnode) in its host
// tree. A reset ends every context on the GPU and takes its MIG devices
// with it: the caller makes sure that nothing holds the GPU first.
// ResetGPU returns once the reset is done; a reset that did not succeed
// is an error matching ErrResetFailed. What the GPU's health signals say
// afterwards is for the caller to read again.
type Resetter interface {
	ResetGPU(ctx context.Context, gpu Device) error
}

// ErrResetFailed: a GPU reset did not succeed; the GPU is as it was, or
// worse. It matches ErrUnavailable.
var ErrResetFailed = Sentinel(ErrUnavailable, "GPU reset failed")

// ResetError is a GPU reset that failed. It matches ErrResetFailed (and
// so ErrUnavailable) and unwraps to the cause.
type ResetError struct {
	// GPU names the GPU: its UUID, else its bus id or index.
	GPU string
	// Err is what the driver or the tool said, if anything.
	Err error
}

func (e *ResetError) Error() string {
	if e.Err == nil {
		return "reset GPU " + e.GPU + ": " + ErrResetFailed.Error()
	}
	return "reset GPU " + e.GPU + ": " + e.Err.Error()
}

// Unwrap returns the cause.
func (e *ResetError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrResetFailed) and errors.Is(err,
// ErrUnavailable) hold.
func (e *ResetError) Is(target error) bool {
	return target == ErrResetFailed || errors.Is(ErrResetFailed, target)
}
