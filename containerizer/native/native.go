package native

import (
	"context"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
)

// DefaultStateDir is where containers' records, /dev and exit statuses live.
const DefaultStateDir = "/run/gpuiso/native"

// Containerizer runs native GPU containers (see the package
// documentation): a containerizer.Lifecycle over the native runtime, which
// decides the containers' states, the launches in progress, the prepare
// step and the one recovery (Recover for an agent that restarted, Clean
// for a program that runs its containers only while it lives). It is safe
// for concurrent use.
type Containerizer struct {
	*containerizer.Lifecycle
	rt *runner
}

var _ containerizer.Containerizer = (*Containerizer)(nil)

// Usage reports what the container's processes use of its GPUs, as NVML
// tells: memory per GPU and, where the driver keeps samples, utilisation.
// Without NVML (Config.NVML) it fails with an error matching
// isolator.ErrNotSupported. It is the Lifecycle's Usage, which a Lifecycle
// over NewRuntime's Runtime has too.
func (c *Containerizer) Usage(ctx context.Context, id string) (nvmlnode.Usage, error) {
	if c == nil || c.rt == nil {
		return nvmlnode.Usage{}, fmt.Errorf("usage of %s: %w", id, containerizer.ErrNotMade)
	}
	return c.Lifecycle.Usage(ctx, id)
}

// Usage reads the use of rec's GPUs by its container's processes
// (containerizer.UsageReader).
func (r *runner) Usage(ctx context.Context, rec containerizer.Record) (nvmlnode.Usage, error) {
	id, cfg := rec.ID, r.cfg
	if cfg.NVML == nil {
		return nvmlnode.Usage{}, fmt.Errorf("usage of %s: no NVML: %w", id, isolator.ErrNotSupported)
	}
	if ret := cfg.NVML.Init(); ret != nvml.SUCCESS {
		return nvmlnode.Usage{}, fmt.Errorf("usage of %s: %w", id, &nvmlnode.NVMLError{Op: "init", Device: -1, Return: ret})
	}
	defer cfg.NVML.Shutdown()
	pids, err := cfg.Isolator.Processes(ctx, id)
	if err != nil {
		return nvmlnode.Usage{}, fmt.Errorf("usage of %s: %w", id, err)
	}
	u, err := nvmlnode.ReadUsage(ctx, cfg.NVML, rec.GPUs, pids)
	if err != nil {
		return u, fmt.Errorf("usage of %s: %w", id, err)
	}
	return u, nil
}
