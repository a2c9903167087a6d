package dockerconfig

import (
	"fmt"
	"slices"
	"strings"

	"github.com/moby/moby/api/types/container"

	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/isolator/cdi"
	"github.com/gpuiso/gpuiso/node"
)

// LabelInjection says how a container got its GPUs: InjectionCDI or
// InjectionDevices.
const LabelInjection = "io.gpuiso.injection"

// How a container gets its GPUs.
const (
	// InjectionDevices: device mappings (--device) of the plan's nodes.
	InjectionDevices = "devices"
	// InjectionCDI: CDI device requests the daemon resolves from the
	// node's CDI spec (see isolator/cdi).
	InjectionCDI = "cdi"
)

// CDIDriver is the device-request driver through which Docker takes CDI
// device names.
const CDIDriver = "cdi"

// CDIMinAPIVersion is the first Docker API version whose daemon resolves
// CDI device requests (Docker 25).
const CDIMinAPIVersion = "1.44"

// CDISupported reports whether a daemon speaking API apiVersion, whose
// information lists cdiSpecDirs (empty where CDI is off or unknown), takes
// CDI device requests.
func CDISupported(apiVersion string, cdiSpecDirs []string) bool {
	return len(cdiSpecDirs) > 0 && compareAPI(apiVersion, CDIMinAPIVersion) >= 0
}

// compareAPI compares "major.minor" API versions; a malformed one is lowest.
func compareAPI(a, b string) int {
	va, err := node.ParseVersion(a)
	if err != nil || len(va) != 2 || strings.TrimSpace(a) != a || strings.HasPrefix(a, "v") {
		return -1
	}
	vb, _ := node.ParseVersion(b)
	return va.Compare(vb)
}

// NewCDI is New for a daemon that speaks CDI: the plan's GPUs become one
// device request of the CDI driver naming them in kind's spec (which the
// node must have written, see isolator/cdi), the control nodes come with
// that spec, and mounts, environment and labels are New's. A plan without
// GPUs requests nothing: its control nodes are mapped as New maps them.
func NewCDI(plan *isolator.Plan, kind string) (*Config, error) {
	c, err := New(plan)
	if err != nil || len(plan.GPUs) == 0 {
		return c, err
	}
	names, err := cdi.Names(kind, plan.GPUs)
	if err != nil {
		return nil, fmt.Errorf("docker config of %s: %w", plan.Owner, err)
	}
	c.Devices = nil
	c.DeviceRequests = []container.DeviceRequest{{Driver: CDIDriver, DeviceIDs: names}}
	c.Labels[LabelInjection] = InjectionCDI
	return c, nil
}

// applyRequests sets c's device requests in hc, replacing any earlier
// request of the same driver.
func (c *Config) applyRequests(hc *container.HostConfig) {
	for _, r := range c.DeviceRequests {
		r.DeviceIDs = slices.Clone(r.DeviceIDs)
		hc.DeviceRequests = slices.DeleteFunc(hc.DeviceRequests, func(e container.DeviceRequest) bool { return e.Driver == r.Driver })
		hc.DeviceRequests = append(hc.DeviceRequests, r)
	}
}
