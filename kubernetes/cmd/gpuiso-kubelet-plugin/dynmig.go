package main

import (
	"flag"
	"fmt"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/simnode"
)

// migFlags choose dynamic MIG (KEP-4815, partitionable devices).
type migFlags struct {
	dynamic bool
	// manager makes and destroys the node's MIG devices: the simulated
	// node's, or NVML's (set by openNode).
	manager allocator.MIGPlacer
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
