package deviceplugin

import (
	"fmt"
	"sort"
	"strings"

	"github.com/gpuiso/gpuiso/node"
)

// Device is one device of a resource as the kubelet sees it.
type Device struct {
	// ID is the kubelet's name for it: the GPU's or MIG device's UUID.
	ID string
	// Healthy tells whether it may be handed out.
	Healthy bool
	// NUMANode is its host NUMA node, or node.NoNUMANode.
	NUMANode int
	// Ref is the device as isolator plans take it.
	Ref node.DeviceRef
	// Position is the parent GPU's position in the inventory.
	Position int
	// TimeSlice tells a time slice of a shared GPU (TimeSlices), Slice a
	// concurrent slice of one (ConcurrentSlices, StrategyMPS), Replica
	// its number on the GPU.
	TimeSlice bool
	Slice     bool
	Replica   int
}

// MIGResourceName is the resource of MIG devices of profile in the domain of
// resourceName: "nvidia.com/gpu" and "1g.10gb" give "nvidia.com/mig-1g.10gb".
func MIGResourceName(resourceName, profile string) string {
	domain, _, _ := strings.Cut(resourceName, "/")
	return domain + "/mig-" + profile
}

// Resources groups devs (the node's GPUs with their current health) into
// the resources the kubelet is told of: whole GPUs under resourceName,
// MIG devices under MIGResourceName of their profile. A GPU split by MIG is
// served only by its MIG devices; a MIG device is healthy when it and its
// parent are. Devices without a UUID are left out (the kubelet could not
// name them). Each resource's devices are in inventory order.
func Resources(resourceName string, devs []node.Device) (map[string][]Device, error) {
	if err := validResourceName(resourceName); err != nil {
		return nil, err
	}
	out := map[string][]Device{}
	for p, d := range devs {
		if !d.MIGSplit() {
			if d.UUID == "" {
				continue
			}
			out[resourceName] = append(out[resourceName], Device{
				ID: d.UUID, Healthy: d.Health.Healthy, NUMANode: d.NUMANode, Ref: d.Ref(), Position: p,
			})
			continue
		}
		for _, m := range d.MIGDevices {
			if m.UUID == "" || m.Profile == "" {
				continue
			}
			name := MIGResourceName(resourceName, m.Profile)
			out[name] = append(out[name], Device{
				ID: m.UUID, Healthy: d.Health.Healthy && m.Health.Healthy, NUMANode: d.NUMANode,
				Ref: d.MIGRef(m), Position: p,
			})
		}
	}
	return out, nil
}

// ResourceNames returns the keys of resources, sorted.
func ResourceNames(resources map[string][]Device) []string {
	names := make([]string, 0, len(resources))
	for n := range resources {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func validResourceName(name string) error {
	domain, res, ok := strings.Cut(name, "/")
	if !ok || domain == "" || res == "" || strings.Contains(res, "/") || !strings.Contains(domain, ".") {
		return fmt.Errorf("resource name %q is not <domain>/<name>: %w", name, ErrInvalidConfig)
	}
	return nil
}

// socketName is the file name of resource's plugin socket.
func socketName(resource string) string {
	r := strings.NewReplacer("/", "-", ".", "_")
	return "gpuiso-" + r.Replace(resource) + ".sock"
}
