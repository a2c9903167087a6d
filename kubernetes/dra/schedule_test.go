package dra_test

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"

	"github.com/gpuiso/gpuiso/kubernetes/dra"
	"github.com/gpuiso/gpuiso/node"
)

// classes is the README's device classes.
type classes map[string]*resourceapi.DeviceClass

func (c classes) List() ([]*resourceapi.DeviceClass, error) {
	out := make([]*resourceapi.DeviceClass, 0, len(c))
	for _, v := range c {
		out = append(out, v)
	}
	return out, nil
}

func (c classes) Get(name string) (*resourceapi.DeviceClass, error) { return c[name], nil }

func class(name, expr string) *resourceapi.DeviceClass {
	return &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: resourceapi.DeviceClassSpec{
		Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: expr}}},
	}}
}

var readmeClasses = classes{
	"gpu.gpuiso.io": class("gpu.gpuiso.io", `device.driver == "gpu.gpuiso.io" && device.attributes["gpu.gpuiso.io"].type == "gpu"`),
	"mig.gpuiso.io": class("mig.gpuiso.io", `device.driver == "gpu.gpuiso.io" && device.attributes["gpu.gpuiso.io"].type == "mig"`),
}

// schedule runs Kubernetes' own structured-parameters allocator (the
// scheduler's DRA plugin uses it) on the node's published slice, with held
// devices already allocated, and returns the devices it gives the claim.
func schedule(t *testing.T, inv *node.Inventory, held []string, claim *resourceapi.ResourceClaim) []string {
	t.Helper()
	slice := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "n1-gpu.gpuiso.io"},
		Spec: resourceapi.ResourceSliceSpec{
			Driver: dra.DefaultDriverName, NodeName: ptr.To("n1"),
			Pool:    resourceapi.ResourcePool{Name: "n1", ResourceSliceCount: 1},
			Devices: dra.Devices(inv, inv.Devices, dra.SliceOptions{}),
		},
	}
	state := structured.AllocatedState{AllocatedDevices: sets.New[structured.DeviceID]()}
	for _, h := range held {
		state.AllocatedDevices.Insert(structured.MakeDeviceID(dra.DefaultDriverName, "n1", h))
	}
	a, err := structured.NewAllocator(t.Context(), structured.Features{}, state, readmeClasses,
		[]*resourceapi.ResourceSlice{slice}, cel.NewCache(10, cel.Features{}))
	if err != nil {
		t.Fatal(err)
	}
	res, err := a.Allocate(t.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}, []*resourceapi.ResourceClaim{claim})
	if err != nil {
		t.Fatal(err)
	}
	if len(res) == 0 {
		return nil
	}
	var out []string
	for _, r := range res[0].Devices.Results {
		out = append(out, r.Device)
	}
	return out
}

func request(class string, count int64, selector string) resourceapi.DeviceRequest {
	r := resourceapi.DeviceRequest{Name: "r", Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count,
	}}
	if selector != "" {
		r.Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: selector}}}
	}
	return r
}

func gpuIndex(t *testing.T, name string) int {
	t.Helper()
	i, err := strconv.Atoi(strings.TrimPrefix(name, "gpu-"))
	if err != nil {
		t.Fatalf("device %q", name)
	}
	return i
}

// TestScheduleConnectedPair: with the scheduler's allocator, a claim for two
// GPUs constrained by matchAttribute on nvlinkClique gets an NVLinked pair,
// where the same claim without the constraint gets one that is not (so the
// case discriminates).
func TestScheduleConnectedPair(t *testing.T) {
	_, inv := inventory(t, "dgx1-volta")
	// GPUs 1-4 are taken: of the free 0, 5, 6, 7 the first two (0 and 5)
	// are not NVLinked on a DGX-1's hybrid cube mesh.
	held := []string{"gpu-1", "gpu-2", "gpu-3", "gpu-4"}
	if inv.Topology.Link(0, 5).NVLinks != 0 {
		t.Fatal("the case assumes GPUs 0 and 5 are not NVLinked")
	}
	tests := []struct {
		name      string
		match     bool
		wantLinks bool
	}{
		{name: "matchAttribute nvlinkClique", match: true, wantLinks: true},
		{name: "no constraint", match: false, wantLinks: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "ns", UID: "u"}}
			c.Spec.Devices.Requests = []resourceapi.DeviceRequest{request("gpu.gpuiso.io", 2, "")}
			if tt.match {
				c.Spec.Devices.Constraints = []resourceapi.DeviceConstraint{{
					Requests: []string{"r"}, MatchAttribute: ptr.To(resourceapi.FullyQualifiedName("gpu.gpuiso.io/" + dra.AttrNVLinkClique)),
				}}
			}
			got := schedule(t, inv, held, c)
			if len(got) != 2 {
				t.Fatalf("allocated %v", got)
			}
			i, j := gpuIndex(t, got[0]), gpuIndex(t, got[1])
			if linked := inv.Topology.Link(i, j).NVLinks > 0; linked != tt.wantLinks {
				t.Errorf("allocated %v: NVLinked %v, want %v", got, linked, tt.wantLinks)
			}
		})
	}
}

// TestScheduleSelectors: the README's selectors pick what they say.
func TestScheduleSelectors(t *testing.T) {
	tests := []struct {
		name, sim string
		req       resourceapi.DeviceRequest
		check     func(inv *node.Inventory, got []string) bool
	}{
		{
			name: "a 1g.10gb MIG device", sim: "hgx-h100-mig",
			req: request("mig.gpuiso.io", 1, `device.attributes["gpu.gpuiso.io"].profile == "1g.10gb"`),
			check: func(inv *node.Inventory, got []string) bool {
				for _, d := range inv.Devices {
					for _, m := range d.MIGDevices {
						if dra.MIGDeviceName(m) == got[0] {
							return m.Profile == "1g.10gb"
						}
					}
				}
				return false
			},
		},
		{
			name: "a GPU of at least 40Gi", sim: "hgx-h100-mig",
			req: request("gpu.gpuiso.io", 1, `device.capacity["gpu.gpuiso.io"].memory.compareTo(quantity("40Gi")) >= 0`),
			check: func(inv *node.Inventory, got []string) bool {
				i, err := strconv.Atoi(strings.TrimPrefix(got[0], "gpu-"))
				return err == nil && !inv.Devices[i].MIGSplit() && inv.Devices[i].MemoryBytes >= 40<<30
			},
		},
		{
			name: "no GPU of 40Gi on a V100 node", sim: "dgx1-volta",
			req:   request("gpu.gpuiso.io", 1, `device.capacity["gpu.gpuiso.io"].memory.compareTo(quantity("40Gi")) >= 0`),
			check: func(_ *node.Inventory, got []string) bool { return got == nil },
		},
		{
			name: "by compute capability", sim: "dgx1-volta",
			req:   request("gpu.gpuiso.io", 8, `device.attributes["gpu.gpuiso.io"].computeCapability.isGreaterThan(semver("6.9.0"))`),
			check: func(_ *node.Inventory, got []string) bool { return len(got) == 8 },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, inv := inventory(t, tt.sim)
			c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "ns", UID: "u"}}
			c.Spec.Devices.Requests = []resourceapi.DeviceRequest{tt.req}
			got := schedule(t, inv, nil, c)
			if (got != nil && len(got) == 0) || !tt.check(inv, slices.Clone(got)) {
				t.Errorf("allocated %v", got)
			}
		})
	}
}
