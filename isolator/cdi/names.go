package cdi

import (
	"fmt"
	"strconv"

	"tags.cncf.io/container-device-interface/pkg/parser"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/node"
)

// Name is the fully qualified CDI name of one GPU of kind: "<kind>=<uuid>",
// or "<kind>=<index>" for a GPU whose UUID is unknown. UUIDs are preferred:
// they name the same GPU whatever order NVML enumerates the node's GPUs in.
func Name(kind string, gpu node.DeviceRef) string {
	vendor, class := parser.ParseQualifier(kind)
	name := gpu.UUID
	if name == "" {
		name = strconv.Itoa(gpu.Index)
	}
	return parser.QualifiedName(vendor, class, name)
}

// Names are the CDI names of gpus (see Name), in their order.
func Names(kind string, gpus []node.DeviceRef) ([]string, error) {
	if err := ValidateKind(kind); err != nil {
		return nil, err
	}
	out := make([]string, 0, len(gpus))
	for _, g := range gpus {
		if g.UUID == "" && g.Index < 0 {
			return nil, fmt.Errorf("CDI names of %s: %w: a GPU without UUID or index", kind, ErrInvalidSpec)
		}
		out = append(out, Name(kind, g))
	}
	return out, nil
}

// AllocationNames are the CDI names of al's GPUs in the node's spec of kind
// (New, written with Writer.Write): one per device of al, by UUID, in al's
// order. They are what an orchestrator hands a CDI-aware runtime (podman
// run --device NAME, a CRI device request, Docker's DeviceRequests with the
// "cdi" driver) for al's owner. An allocation of no GPU has no names. A
// device without a UUID is never in New's spec, so its name would resolve
// to nothing: it is an error matching ErrUnresolvable.
//
// The names of an allocation's own device (Render, written with
// Writer.WriteAllocation) are in the Result that WriteAllocation returns.
func AllocationNames(kind string, al allocator.Allocation) ([]string, error) {
	for _, d := range al.Devices {
		if d.UUID == "" {
			return nil, fmt.Errorf("CDI names of the allocation of %s: gpu %d: %w: no UUID, so not in the node's spec", al.Owner, d.Index, ErrUnresolvable)
		}
	}
	names, err := Names(kind, al.Devices)
	if err != nil {
		return nil, fmt.Errorf("allocation of %s: %w", al.Owner, err)
	}
	return names, nil
}
