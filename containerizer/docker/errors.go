package docker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"

	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/node"
)

var (
	// ErrDaemonUnavailable: the Docker daemon does not answer (stopped,
	// restarting, or its socket is gone). What was asked did not happen; the
	// containerizer's state is as it was, and the call may be repeated once
	// the daemon is back.
	ErrDaemonUnavailable = node.Sentinel(node.ErrUnavailable, "docker daemon unavailable")
	// ErrNoVolume: the image asks for the driver volume but the
	// containerizer has no volume manager (see WithVolumes). It is the
	// prepare step's containerizer.ErrNoVolume.
	ErrNoVolume = containerizer.ErrNoVolume
	// ErrNotManaged: a container the daemon lists carries gpuiso's labels
	// but cannot be adopted (its labels do not parse, its owner has another
	// container, or its GPUs are held by another owner). It is the
	// lifecycle's containerizer.ErrNotAdopted.
	ErrNotManaged = containerizer.ErrNotAdopted
)

// DaemonError is a call the Docker daemon did not answer.
type DaemonError struct {
	// Op is what was asked ("inspect image", "create container", ...).
	Op string
	// Err is the client's error.
	Err error
}

func (e *DaemonError) Error() string {
	return fmt.Sprintf("%s: docker daemon unavailable: %v", e.Op, e.Err)
}

// Is matches ErrDaemonUnavailable.
func (e *DaemonError) Is(target error) bool {
	return target == ErrDaemonUnavailable || target == node.ErrUnavailable
}

// Unwrap returns the client's error.
func (e *DaemonError) Unwrap() error { return e.Err }

// daemonErr turns an error of the client into a *DaemonError when it says
// that the daemon could not be reached or dropped the connection. The
// daemon's answers of a class that routes a caller come back matching the
// kind of node's vocabulary of that class: not found (an image the daemon
// lacks) node.ErrNotFound, an invalid argument node.ErrInvalid, not
// implemented node.ErrNotSupported; others (a conflict, a daemon fault)
// as they are.
func daemonErr(op string, err error) error {
	if err == nil {
		return nil
	}
	var netErr *net.OpError
	unreachable := client.IsErrConnectionFailed(err) ||
		linux.Unreachable(err) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		(errors.As(err, &netErr) && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded))
	switch {
	case unreachable:
		return &DaemonError{Op: op, Err: err}
	case cerrdefs.IsNotFound(err):
		return fmt.Errorf("%s: %w: %w", op, node.ErrNotFound, err)
	case cerrdefs.IsInvalidArgument(err):
		return fmt.Errorf("%s: %w: %w", op, node.ErrInvalid, err)
	case cerrdefs.IsNotImplemented(err):
		return fmt.Errorf("%s: %w: %w", op, node.ErrNotSupported, err)
	}
	return fmt.Errorf("%s: %w", op, err)
}
