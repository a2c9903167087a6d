package deviceplugin

import (
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/nomad/internal/proto/device"
	"github.com/gpuiso/gpuiso/nomad/internal/proto/structs"
)

// Statistic names of a device's StatObject.
const (
	StatMemory      = "memory"      // used / total, MiB (also the summary)
	StatUtilization = "utilization" // GPU utilisation, percent
	StatTemperature = "temperature" // GPU temperature, C
	StatPower       = "power"       // power draw, W
)

// DefaultStatsInterval is the collection interval of a Stats call that
// names none.
const DefaultStatsInterval = 10 * time.Second

// stats reads each offered device's statistics from NVML, grouped as the
// fingerprint groups them. A statistic NVML does not answer is left out;
// a device it cannot read at all is left out of its group.
func (st *state) stats(groups []*device.DeviceGroup) *device.StatsResponse {
	resp := &device.StatsResponse{}
	if st.alloc == nil || !st.nvmlUp {
		return resp
	}
	now := timestamppb.Now()
	for _, g := range groups {
		gs := &device.DeviceGroupStats{Vendor: g.Vendor, Type: g.DeviceType, Name: g.DeviceName, InstanceStats: map[string]*device.DeviceStats{}}
		for _, d := range g.Devices {
			if s := st.deviceStats(d.ID); s != nil {
				s.Timestamp = now
				gs.InstanceStats[d.ID] = s
			}
		}
		resp.Groups = append(resp.Groups, gs)
	}
	return resp
}

// deviceStats reads one device's statistics.
func (st *state) deviceStats(id string) *device.DeviceStats {
	h, r := st.lib.DeviceGetHandleByUUID(id)
	if r != nvml.SUCCESS {
		return nil
	}
	attrs := map[string]*structs.StatValue{}
	var summary *structs.StatValue
	if mem, r := h.GetMemoryInfo(); r == nvml.SUCCESS {
		summary = &structs.StatValue{
			IntNumeratorVal:   wrapperspb.Int64(int64((mem.Total - mem.Free) >> 20)),
			IntDenominatorVal: wrapperspb.Int64(int64(mem.Total >> 20)),
			Unit:              node.UnitMiB,
			Desc:              "memory used / total",
		}
		attrs[StatMemory] = summary
	}
	if u, r := h.GetUtilizationRates(); r == nvml.SUCCESS {
		attrs[StatUtilization] = &structs.StatValue{IntNumeratorVal: wrapperspb.Int64(int64(u.Gpu)), Unit: "%", Desc: "GPU utilization"}
	}
	if t, r := h.GetTemperature(nvml.TEMPERATURE_GPU); r == nvml.SUCCESS {
		attrs[StatTemperature] = &structs.StatValue{IntNumeratorVal: wrapperspb.Int64(int64(t)), Unit: "C", Desc: "GPU temperature"}
	}
	if mw, r := h.GetPowerUsage(); r == nvml.SUCCESS {
		attrs[StatPower] = &structs.StatValue{IntNumeratorVal: wrapperspb.Int64(int64(mw / 1000)), Unit: node.UnitW, Desc: "power draw"}
	}
	if len(attrs) == 0 {
		return nil
	}
	return &device.DeviceStats{Summary: summary, Stats: &structs.StatObject{Attributes: attrs}}
}

// Stats streams the offered devices' statistics every collection interval
// (DefaultStatsInterval when the request names none).
func (p *Plugin) Stats(req *device.StatsRequest, stream device.DevicePlugin_StatsServer) error {
	ctx := stream.Context()
	interval := DefaultStatsInterval
	if d := req.GetCollectionInterval(); d != nil && d.AsDuration() > 0 {
		interval = d.AsDuration()
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		st, wake := p.current()
		if st == nil {
			if p.isClosed() {
				return nil
			}
			return grpcError(ErrNotConfigured)
		}
		if !st.enter() {
			continue // replaced: the next turn reads the configuration in force
		}
		resp := st.stats(st.fingerprint().GetDeviceGroup())
		st.leave()
		if err := stream.Send(resp); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-wake:
		case <-tick.C:
		}
	}
}
