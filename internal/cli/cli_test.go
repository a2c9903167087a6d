package cli

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
)

func TestExplainDiscover(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"library", &nvmlnode.NVMLError{Op: "init", Device: -1, Return: nvml.ERROR_LIBRARY_NOT_FOUND}, "libnvidia-ml.so.1 not found"},
		{"driver", fmt.Errorf("discover: %w", &nvmlnode.NVMLError{Op: "init", Device: -1, Return: nvml.ERROR_DRIVER_NOT_LOADED}), "driver not loaded"},
		{"other", errors.New("disk on fire"), "disk on fire"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ExplainDiscover(tt.err)
			if !strings.Contains(got, tt.want) || strings.Contains(got, "\n") {
				t.Fatalf("ExplainDiscover = %q, want one line with %q", got, tt.want)
			}
			if tt.name != "other" && !strings.Contains(got, "--simulate") {
				t.Fatalf("ExplainDiscover = %q does not suggest --simulate", got)
			}
		})
	}
}

func TestDescribeGPUs(t *testing.T) {
	if got := DescribeGPUs(nil); got != "no GPUs" {
		t.Fatalf("DescribeGPUs(nil) = %q", got)
	}
	got := DescribeGPUs([]node.DeviceRef{{Index: 1, UUID: "GPU-a"}, {Index: 3, UUID: "GPU-b"}})
	if got != "GPUs 1,3 (GPU-a,GPU-b)" {
		t.Fatalf("DescribeGPUs = %q", got)
	}
}
