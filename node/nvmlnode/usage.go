package nvmlnode

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuiso/gpuiso/node"
)

// Usage is what a container uses of its GPUs, as NVML reports it: the
// node model's [node.Usage], named here as before.
type Usage = node.Usage

// GPUUsage is one GPU's share used by the container's processes
// ([node.GPUUsage]).
type GPUUsage = node.GPUUsage

// ReadUsage asks NVML (initialised by the caller) what the processes pids
// use of gpus. A driver that cannot list a GPU's processes gives an error
// matching ErrNotSupported; other GPUs' usage is still returned.
func ReadUsage(ctx context.Context, lib nvml.Interface, gpus []node.DeviceRef, pids []int) (Usage, error) {
	var u Usage
	var errs []error
	for _, g := range gpus {
		if err := ctx.Err(); err != nil {
			return u, err
		}
		gu, err := gpuUsage(lib, g, pids)
		if err != nil {
			errs = append(errs, fmt.Errorf("usage of GPU %d (%s): %w", g.Index, g.UUID, err))
			continue
		}
		u.GPUs = append(u.GPUs, gu)
	}
	return u, errors.Join(errs...)
}

func gpuUsage(lib nvml.Interface, g node.DeviceRef, pids []int) (GPUUsage, error) {
	gu := GPUUsage{UUID: g.UUID}
	h, ret := lib.DeviceGetHandleByUUID(g.UUID)
	if ret != nvml.SUCCESS {
		return gu, nvmlErr("get handle", ret)
	}
	mine := func(pid uint32) bool { return slices.Contains(pids, int(pid)) }
	listed := false
	for _, list := range []func() ([]nvml.ProcessInfo, nvml.Return){h.GetComputeRunningProcesses, h.GetGraphicsRunningProcesses} {
		procs, ret := list()
		if ret == nvml.ERROR_NOT_SUPPORTED {
			continue
		}
		if ret != nvml.SUCCESS {
			return gu, nvmlErr("list processes", ret)
		}
		listed = true
		for _, p := range procs {
			if mine(p.Pid) && !slices.Contains(gu.Processes, int(p.Pid)) {
				gu.Processes = append(gu.Processes, int(p.Pid))
				gu.MemoryBytes += p.UsedGpuMemory
			}
		}
	}
	if !listed {
		return gu, fmt.Errorf("list processes: %w", node.ErrNotSupported)
	}
	samples, ret := h.GetProcessUtilization(0)
	if ret == nvml.SUCCESS {
		var sm, mem uint32
		for _, s := range samples {
			if mine(s.Pid) {
				sm, mem = max(sm, s.SmUtil), max(mem, s.MemUtil)
			}
		}
		gu.SMUtilization, gu.MemoryUtilization = &sm, &mem
	}
	return gu, nil
}

func nvmlErr(op string, ret nvml.Return) error {
	if ret == nvml.ERROR_NOT_SUPPORTED {
		return fmt.Errorf("%s: %w", op, node.ErrNotSupported)
	}
	return &NVMLError{Op: op, Device: -1, Return: ret}
}
