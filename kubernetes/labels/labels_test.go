package labels_test

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gpuiso/gpuiso/kubernetes/labels"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
)

func inventory(t *testing.T, name string) *node.Inventory {
	t.Helper()
	sim, err := simnode.New(name, simnode.WithDriverVersion("550.127.05"), simnode.WithCUDAVersion(12040))
	if err != nil {
		t.Fatal(err)
	}
	inv, err := nvmlnode.Discover(context.Background(), append(sim.DiscoverOptions(nil),
		nvmlnode.WithDevRoot(t.TempDir()), nvmlnode.WithProcRoot(t.TempDir()), nvmlnode.WithSysRoot(t.TempDir()))...)
	if err != nil {
		t.Fatal(err)
	}
	return inv
}

// TestLabels: the labels of simulated nodes.
func TestLabels(t *testing.T) {
	tests := []struct {
		name string
		sim  string
		want map[string]string // a subset of the labels
		none []string          // labels that must be absent
	}{
		{name: "dgx1-volta", sim: "dgx1-volta", want: map[string]string{
			"nvidia.com/gpu.count":          "8",
			"nvidia.com/gpu.product":        "Tesla-V100-SXM2-16GB",
			"nvidia.com/gpu.memory":         "16384",
			"nvidia.com/gpu.family":         "volta",
			"nvidia.com/gpu.compute.major":  "7",
			"nvidia.com/gpu.compute.minor":  "0",
			"nvidia.com/cuda.driver.major":  "550",
			"nvidia.com/cuda.driver.minor":  "127",
			"nvidia.com/cuda.driver.rev":    "05",
			"nvidia.com/cuda.runtime.major": "12",
			"nvidia.com/cuda.runtime.minor": "4",
			"nvidia.com/mig.capable":        "false",
		}, none: []string{"nvidia.com/mig-1g.10gb.count"}},
		{name: "hgx-h100-mig", sim: "hgx-h100-mig", want: map[string]string{
			"nvidia.com/gpu.count":         "8",
			"nvidia.com/gpu.family":        "hopper",
			"nvidia.com/mig.capable":       "true",
			"nvidia.com/mig-1g.10gb.count": "", // present, any count
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := labels.Labels(inventory(t, tt.sim))
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range tt.want {
				g, ok := got[k]
				if !ok || (v != "" && g != v) {
					t.Errorf("%s = %q (present %v), want %q", k, g, ok, v)
				}
			}
			for _, k := range tt.none {
				if _, ok := got[k]; ok {
					t.Errorf("%s present", k)
				}
			}
			for k := range got {
				if !labels.Owned(k) {
					t.Errorf("label %s is not of an owned family", k)
				}
			}
		})
	}
}

// TestLabelsPure: Labels reads the inventory alone: an inventory no
// allocator takes (no topology) is labelled all the same, its model name
// cleaned into a label value, and a nil inventory is refused.
func TestLabelsPure(t *testing.T) {
	inv := &node.Inventory{DriverVersion: "550.127.05", Devices: []node.Device{
		{Index: 0, UUID: "GPU-0", Model: "NVIDIA H100 80GB HBM3", Architecture: "hopper", ComputeCapability: "9.0", MemoryBytes: 80 << 30, MIGProfiles: []node.MIGProfile{{Name: "1g.10gb"}}},
	}}
	got, err := labels.Labels(inv)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "1", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
		"nvidia.com/gpu.memory": "81920", "nvidia.com/gpu.family": "hopper", "nvidia.com/gpu.compute.major": "9",
		"nvidia.com/gpu.compute.minor": "0", "nvidia.com/cuda.driver.major": "550", "nvidia.com/cuda.driver.minor": "127",
		"nvidia.com/cuda.driver.rev": "05", "nvidia.com/mig.capable": "true",
	}
	if !maps.Equal(got, want) {
		t.Errorf("labels %v, want %v", got, want)
	}
	if _, err := labels.Labels(nil); !errors.Is(err, node.ErrInvalid) {
		t.Errorf("Labels(nil) = %v, want node.ErrInvalid", err)
	}
}

// TestPatch: the merge patch sets changed labels, removes owned ones that
// no longer hold, and leaves everything else.
func TestPatch(t *testing.T) {
	tests := []struct {
		name    string
		current map[string]string
		want    map[string]string
		patch   map[string]any // nil: no patch
	}{
		{name: "new node", current: map[string]string{"kubernetes.io/os": "linux"},
			want:  map[string]string{"nvidia.com/gpu.count": "8"},
			patch: map[string]any{"nvidia.com/gpu.count": "8"}},
		{name: "unchanged", current: map[string]string{"nvidia.com/gpu.count": "8"},
			want: map[string]string{"nvidia.com/gpu.count": "8"}},
		{name: "stale owned label removed, others kept",
			current: map[string]string{"nvidia.com/gpu.count": "8", "nvidia.com/mig-1g.10gb.count": "3", "nvidia.com/other": "x"},
			want:    map[string]string{"nvidia.com/gpu.count": "7"},
			patch:   map[string]any{"nvidia.com/gpu.count": "7", "nvidia.com/mig-1g.10gb.count": nil}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := labels.Patch(tt.current, tt.want)
			if tt.patch == nil {
				if b != nil {
					t.Fatalf("patch %s, want none", b)
				}
				return
			}
			var p struct {
				Metadata struct {
					Labels map[string]any `json:"labels"`
				} `json:"metadata"`
			}
			if err := json.Unmarshal(b, &p); err != nil {
				t.Fatal(err)
			}
			if !maps.Equal(p.Metadata.Labels, tt.patch) {
				t.Errorf("patch %v, want %v", p.Metadata.Labels, tt.patch)
			}
		})
	}
}

// TestApply: the labels reach the Node object through the API.
func TestApply(t *testing.T) {
	c := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{
		"kubernetes.io/os": "linux", "nvidia.com/gpu.product": "old",
	}}})
	want, err := labels.Labels(inventory(t, "dgx1-volta"))
	if err != nil {
		t.Fatal(err)
	}
	changed, err := labels.Apply(t.Context(), c, "n1", want)
	if err != nil || len(changed) == 0 {
		t.Fatalf("Apply = %v, %v", changed, err)
	}
	n, err := c.CoreV1().Nodes().Get(t.Context(), "n1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range want {
		if n.Labels[k] != v {
			t.Errorf("%s = %q, want %q", k, n.Labels[k], v)
		}
	}
	if n.Labels["kubernetes.io/os"] != "linux" {
		t.Error("foreign label lost")
	}
	if again, err := labels.Apply(t.Context(), c, "n1", want); err != nil || len(again) != 0 {
		t.Errorf("Apply again = %v, %v", again, err)
	}
}
