package docker

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
)

// LabelSupervisor names the process that runs a container and whose death
// ends it, "<pid>.<start time>" (see WithSupervisor).
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
		if h.Pid <= 0 || h.Start == 0 {
			return fmt.Errorf("supervisor pid %d started at %d: %w", h.Pid, h.Start, allocator.ErrInvalidRequest)
		}
		c.supervisor = &h
		return nil
	}
}

func formatSupervisor(h allocator.Holder) string {
	return strconv.Itoa(h.Pid) + "." + strconv.FormatUint(h.Start, 10)
}

// parseSupervisor reads a LabelSupervisor value.
func parseSupervisor(v string) (allocator.Holder, bool) {
	p, s, ok := strings.Cut(v, ".")
	pid, err1 := strconv.Atoi(p)
	start, err2 := strconv.ParseUint(s, 10, 64)
	if !ok || err1 != nil || err2 != nil || pid <= 0 || start == 0 {
		return allocator.Holder{}, false
	}
	return allocator.Holder{Pid: pid, Start: start}, true
}

// Backend builds, for containerizer.Compose, a Docker containerizer on the
// daemon cli talks to, over the composite's allocator (and the node it was
// made for). WithReconcileAllocator is refused (the composite
// reconciles) with an error matching containerizer.ErrAllocatorMismatch.
func Backend(cli Client, opts ...Option) containerizer.Backend {
	return func(alloc *allocator.Allocator) (containerizer.Kind, containerizer.Containerizer, error) {
		if alloc == nil {
			return containerizer.KindDocker, nil, fmt.Errorf("docker containerizer: nil allocator: %w", containerizer.ErrAllocatorMismatch)
		}
		z, err := New(cli, alloc, opts...)
		if err != nil {
			return containerizer.KindDocker, nil, err
		}
		if z.ReconcilesAllocator() {
			return containerizer.KindDocker, nil, fmt.Errorf("docker containerizer: WithReconcileAllocator in a composite: %w", containerizer.ErrAllocatorMismatch)
		}
		return containerizer.KindDocker, z, nil
	}
}
