package docker

import (
	"fmt"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/node"
)

// LabelSupervisor names the process that runs a container and whose death
// ends it, in node.Process's text form "<pid>.<start time>" (see
// WithSupervisor).
const LabelSupervisor = "io.gpuiso.supervisor"

// WithSupervisor makes h, a process (see allocator.ProcessHolder), the
// supervisor of every container the containerizer launches: the container
// carries it in LabelSupervisor, and its GPUs are held with h as their
// holder unless the spec's request names another. A program that runs
// containers only while it lives (dockerrun) passes its own process; once
// it is dead, Clean (of any containerizer on the namespace, see
// containerizer.Lifecycle.Clean) removes its containers and gives back what
// they held.
func WithSupervisor(h allocator.Holder) Option {
	return func(c *config) error {
		if !h.Valid() {
			return fmt.Errorf("supervisor pid %d started at %d: %w", h.Pid, h.Start, allocator.ErrInvalidRequest)
		}
		c.supervisor = &h
		return nil
	}
}

func formatSupervisor(h allocator.Holder) string { return h.String() }

// parseSupervisor reads a LabelSupervisor value.
func parseSupervisor(v string) (allocator.Holder, bool) {
	p, err := node.ParseProcess(v)
	return p, err == nil
}

// Supervisor is the supervisor of the runtime's containers (WithSupervisor),
// or nil: a containerizer.Lifecycle records it and holds their GPUs with
// it (containerizer.Supervised).
func (r *Runtime) Supervisor() *allocator.Holder {
	if r == nil || r.cfg.supervisor == nil {
		return nil
	}
	h := *r.cfg.supervisor
	return &h
}
