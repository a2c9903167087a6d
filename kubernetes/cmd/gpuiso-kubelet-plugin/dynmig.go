package main

import (
	"context"
	"flag"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/kubernetes/dra"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/simnode"
)

// migFlags choose dynamic MIG (KEP-4815, partitionable devices).
type migFlags struct {
	dynamic bool
	// manager makes and destroys the node's MIG devices: the simulated
	// node's, or NVML's (set by openNode).
	manager allocator.MIGPlacer
	// destroyer destroys a GPU instance by its placement, with or without
	// a compute instance: NVML's (set by openNode); the simulated driver
	// keeps no GPU instance without its compute instance.
	destroyer dra.MIGPlacementDestroyer
}

func (m *migFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&m.dynamic, "dynamic-mig", false, "DRA: partition every GPU with MIG enabled on demand: publish its memory and compute slices as counters and every placement of every MIG profile, and the GPU whole, as devices that consume them; a claim's MIG device is made when it is prepared and destroyed when it is unprepared (MIG devices that gpuiso did not make are kept and published as they are)")
}

// check refuses --dynamic-mig where it cannot work: without the DRA
// driver, or beside the device plugin, which would hand out MIG devices
// the scheduler's counters do not know.
func (m *migFlags) check(f *flags) string {
	switch {
	case !m.dynamic:
		return ""
	case !f.dra:
		return "--dynamic-mig needs the DRA driver"
	case f.devicePlugin:
		return "--dynamic-mig and the device plugin: the device plugin would hand out MIG devices the scheduler's counters do not know (--device-plugin=false)"
	}
	return ""
}

// options are the allocator's options for dynamic MIG: its MIG manager.
func (m *migFlags) options() []allocator.Option {
	if !m.dynamic || m.manager == nil {
		return nil
	}
	return []allocator.Option{allocator.WithMIGManager(m.manager)}
}

// gpus are the GPUs partitioned on demand: with --dynamic-mig and a MIG
// manager, every GPU of inv with MIG enabled and MIG profiles.
func (m *migFlags) gpus(inv *node.Inventory) []string {
	if !m.dynamic || m.manager == nil {
		return nil
	}
	var out []string
	for _, d := range inv.Devices {
		if d.MIGSplit() && len(d.MIGProfiles) > 0 && d.UUID != "" {
			out = append(out, d.UUID)
		}
	}
	return out
}

// simulated sets up a simulated node's MIG side before its discovery: with
// --dynamic-mig it gets the MIG layout its host tree records (the MIG
// devices made before a restart, as a real GPU keeps them), and the
// manager is the simulated node's, the caps major read from the tree's
// /proc/devices when the tree was found rather than made.
func (m *migFlags) simulated(sim *simnode.Node, host *simnode.Host) error {
	if host.CapsMajor == 0 {
		majors, err := node.ReadProcDevices(host.ProcRoot)
		if err != nil {
			return fmt.Errorf("simulated host: %w", err)
		}
		host.CapsMajor = majors[node.NVIDIACaps]
	}
	if m.dynamic {
		if err := sim.RestoreMIG(host); err != nil {
			return fmt.Errorf("simulated host: %w", err)
		}
	}
	m.manager = sim.MIGManager(host)
	return nil
}

// nvmlPlacements destroys GPU instances by placement through NVML
// (dra.MIGPlacementDestroyer): what a creation cut short between the GPU
// instance and its compute instance left, which no MIG device lists.
type nvmlPlacements struct{ lib nvml.Interface }

func (p nvmlPlacements) DestroyMIGAt(ctx context.Context, parent string, start int) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if ret := p.lib.Init(); ret != nvml.SUCCESS {
		return fmt.Errorf("destroy the GPU instance at %d of %s: init NVML: %s", start, parent, nvml.ErrorString(ret))
	}
	defer p.lib.Shutdown()
	h, ret := p.lib.DeviceGetHandleByUUID(parent)
	if ret != nvml.SUCCESS {
		return fmt.Errorf("destroy the GPU instance at %d of %s: %s", start, parent, nvml.ErrorString(ret))
	}
	for idx := range nvml.GPU_INSTANCE_PROFILE_COUNT {
		info, ret := h.GetGpuInstanceProfileInfo(idx)
		if ret != nvml.SUCCESS {
			continue
		}
		gis, ret := h.GetGpuInstances(&info)
		if ret != nvml.SUCCESS {
			continue
		}
		for _, gi := range gis {
			gii, ret := gi.GetInfo()
			if ret != nvml.SUCCESS || int(gii.Placement.Start) != start {
				continue
			}
			for cp := range nvml.COMPUTE_INSTANCE_PROFILE_COUNT {
				ciInfo, ret := gi.GetComputeInstanceProfileInfo(cp, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
				if ret != nvml.SUCCESS {
					continue
				}
				cis, _ := gi.GetComputeInstances(&ciInfo)
				for _, ci := range cis {
					if ret := ci.Destroy(); ret != nvml.SUCCESS {
						return fmt.Errorf("destroy a compute instance of the GPU instance at %d of %s: %s", start, parent, nvml.ErrorString(ret))
					}
				}
			}
			if ret := gi.Destroy(); ret != nvml.SUCCESS {
				return fmt.Errorf("destroy the GPU instance at %d of %s: %s", start, parent, nvml.ErrorString(ret))
			}
			return nil
		}
	}
	return fmt.Errorf("no GPU instance at %d of %s: %w", start, parent, node.ErrNotFound)
}
