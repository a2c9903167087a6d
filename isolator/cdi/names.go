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

// AllocationNames are the CDI names that give a CDI-aware runtime
// (podman run --device NAME, a CRI device request, Docker's DeviceRequests
// with the "cdi" driver) al's container: the allocation's own device,
// AllocationDevice(al.Owner), which Render writes from al's plan (see
// Writer.WriteAllocation). It carries every node of al's devices and the
// allocation's environment, so the container's NVIDIA_VISIBLE_DEVICES and
// CUDA_VISIBLE_DEVICES name every GPU of al.
func AllocationNames(kind string, al allocator.Allocation) ([]string, error) {
	if err := ValidateKind(kind); err != nil {
		return nil, err
	}
	if err := node.ValidateOwner(al.Owner); err != nil {
		return nil, fmt.Errorf("CDI names of %s: %w", kind, err)
	}
	vendor, class := parser.ParseQualifier(kind)
	return []string{parser.QualifiedName(vendor, class, AllocationDevice(al.Owner))}, nil
}
