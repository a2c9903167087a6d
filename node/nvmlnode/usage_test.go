package nvmlnode_test

import (
	"context"
	"errors"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
)

func TestReadUsage(t *testing.T) {
	sim, err := simnode.New("dgx1-volta")
	if err != nil {
		t.Fatal(err)
	}
	sim.SetProcesses(1, nvml.ProcessInfo{Pid: 100, UsedGpuMemory: 1 << 30}, nvml.ProcessInfo{Pid: 200, UsedGpuMemory: 2 << 30}, nvml.ProcessInfo{Pid: 101, UsedGpuMemory: 1 << 20})
	sim.SetProcessUtilization(1, nvml.ProcessUtilizationSample{Pid: 100, SmUtil: 30, MemUtil: 10}, nvml.ProcessUtilizationSample{Pid: 101, SmUtil: 55, MemUtil: 5}, nvml.ProcessUtilizationSample{Pid: 200, SmUtil: 99, MemUtil: 99})
	gpus := []node.DeviceRef{{Index: 1, UUID: sim.UUID(1)}, {Index: 3, UUID: sim.UUID(3)}}
	u, err := nvmlnode.ReadUsage(context.Background(), sim.NVML(), gpus, []int{100, 101})
	if err != nil {
		t.Fatal(err)
	}
	g1, g3 := u.GPUs[0], u.GPUs[1]
	if g1.MemoryBytes != 1<<30+1<<20 || len(g1.Processes) != 2 || *g1.SMUtilization != 55 || *g1.MemoryUtilization != 10 {
		t.Fatalf("GPU 1 usage = %+v", g1)
	}
	if g3.MemoryBytes != 0 || len(g3.Processes) != 0 || g3.SMUtilization != nil {
		t.Fatalf("GPU 3 usage = %+v, want nothing and no samples", g3)
	}
}

func TestReadUsageNotSupported(t *testing.T) {
	dev := &mock.Device{
		GetComputeRunningProcessesFunc:  func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.ERROR_NOT_SUPPORTED },
		GetGraphicsRunningProcessesFunc: func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.ERROR_NOT_SUPPORTED },
	}
	lib := &mock.Interface{DeviceGetHandleByUUIDFunc: func(string) (nvml.Device, nvml.Return) { return dev, nvml.SUCCESS }}
	_, err := nvmlnode.ReadUsage(context.Background(), lib, []node.DeviceRef{{UUID: "GPU-x"}}, []int{1})
	if !errors.Is(err, isolator.ErrNotSupported) {
		t.Fatalf("ReadUsage = %v, want ErrNotSupported", err)
	}
}
