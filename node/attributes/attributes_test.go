package attributes_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/attributes"
)

// volta is eight V100s of 16 GiB, the second unhealthy.
func volta() *node.Inventory {
	inv := &node.Inventory{DriverVersion: "535.104.05", CUDAVersion: node.CUDAVersion(12020)}
	for i := range 8 {
		d := node.Device{Index: i, Model: "Tesla V100-SXM2-16GB", Architecture: "volta", ComputeCapability: "7.0",
			MemoryBytes: 16 << 30, Health: node.Healthy()}
		if i == 1 {
			d.Health = node.Health{Reason: "xid 79"}
		}
		inv.Devices = append(inv.Devices, d)
	}
	return inv
}

func TestMesos(t *testing.T) {
	attrs := attributes.Mesos(volta())
	want := map[string]string{"gpus": "7", "gpus_total": "8", "gpu_models": "Tesla V100-SXM2-16GB", "gpu_memory_mib": "16384",
		"driver_version": "535.104.05", "cuda_version": "12.2"}
	if fmt.Sprint(attrs) != fmt.Sprint(want) {
		t.Errorf("Mesos = %v, want %v", attrs, want)
	}
	if attributes.Mesos(nil) != nil {
		t.Error("attributes of no inventory")
	}
	if s := attributes.FormatMesos(map[string]string{"b": "x;y:z", "a": "1"}); s != "a:1;b:x_y_z" {
		t.Errorf("FormatMesos = %q", s)
	}
}

func TestLabels(t *testing.T) {
	labels := attributes.Labels(volta())
	want := map[string]string{
		"nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "8", "nvidia.com/gpu.product": "Tesla-V100-SXM2-16GB",
		"nvidia.com/gpu.memory": "16384", "nvidia.com/gpu.family": "volta", "nvidia.com/gpu.compute.major": "7",
		"nvidia.com/gpu.compute.minor": "0", "nvidia.com/cuda.driver.major": "535", "nvidia.com/cuda.driver.minor": "104",
		"nvidia.com/cuda.driver.rev": "05", "nvidia.com/cuda.runtime.major": "12", "nvidia.com/cuda.runtime.minor": "2",
	}
	if fmt.Sprint(labels) != fmt.Sprint(want) {
		t.Errorf("Labels = %v,\nwant %v", labels, want)
	}
	mixed := volta()
	mixed.Devices[3].Model = "Tesla V100-SXM2-32GB"
	if p := attributes.Labels(mixed)["nvidia.com/gpu.product"]; p != "mixed" {
		t.Errorf("gpu.product of two models = %q", p)
	}
	if attributes.Labels(nil) != nil {
		t.Error("labels of no inventory")
	}
	if l := attributes.Labels(&node.Inventory{}); l["nvidia.com/gpu.present"] != "false" || l["nvidia.com/gpu.count"] != "0" {
		t.Errorf("labels of a node without GPUs: %v", l)
	}
}

func TestLabelValue(t *testing.T) {
	for in, want := range map[string]string{"Tesla V100-SXM2-16GB": "Tesla-V100-SXM2-16GB", "(x)": "x", "": "",
		strings.Repeat("a", 70): strings.Repeat("a", 63), "-a.": "a"} {
		if got := attributes.LabelValue(in); got != want {
			t.Errorf("LabelValue(%q) = %q, want %q", in, got, want)
		}
	}
}
