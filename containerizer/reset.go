package containerizer

import (
	"context"
	"errors"
	"fmt"

	"github.com/gpuiso/gpuiso/node"
)

// StopForReset is the policy "stop" for a GPU waiting for its reset (the
// health monitor's reset policy: nvmlnode.ResetPolicyFunc(l.StopForReset)
// passed to nvmlnode.WithReset): each of owners that is a container of
// the Lifecycle (a container's ID is the owner of its GPUs) is destroyed
// as Destroy does, killed if it runs, so that its GPUs are given back and
// the GPU can be reset. An owner that is no container of the Lifecycle is
// left alone, and so is every container not among owners, on gpu or not.
// The errors of the containers it could not destroy are joined; those
// stay as they were. Without this policy the reset waits for the
// containers to end on their own.
func (l *Lifecycle) StopForReset(ctx context.Context, gpu node.Device, owners []string) error {
	if !l.made() {
		return fmt.Errorf("stop containers for the reset of GPU %d: %w", gpu.Index, ErrNotMade)
	}
	ours := map[string]bool{}
	for _, c := range l.Containers() {
		ours[c.ID] = true
	}
	var errs []error
	for _, o := range owners {
		if !ours[o] {
			continue
		}
		if err := l.Destroy(ctx, o); err != nil {
			errs = append(errs, fmt.Errorf("stop %s for the reset of GPU %d: %w", o, gpu.Index, err))
		}
	}
	return errors.Join(errs...)
}
