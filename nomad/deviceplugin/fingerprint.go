package deviceplugin

import (
	"slices"
	"strconv"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/nomad/internal/proto/device"
	"github.com/gpuiso/gpuiso/nomad/internal/proto/structs"
)

// Attribute names beyond those of node (memory, bar1, power, cores_clock,
// memory_clock, pci_bandwidth, driver_version, display_state,
// persistence_mode), which keep their Nomad names and units.
const (
	AttrComputeCapability = "compute_capability" // "7.0"
	AttrArchitecture      = "architecture"       // "volta"
	AttrCUDAVersion       = "cuda_version"       // the newest CUDA the driver runs, "12.2"
	AttrNUMANode          = "numa_node"          // the host NUMA node, when every device of the group shares it
	AttrNVLink            = "nvlink"             // whether the GPUs have NVLinks to other GPUs of the node
	AttrMIGProfile        = "mig_profile"        // a MIG device's profile, "1g.10gb"
	AttrSharing           = "sharing"            // "exclusive": a device is one task's, held in gpuiso's state
	AttrIsolation         = "isolation"          // how a task's GPUs are isolated: "devices" or "runtime"
)

// offer is a device the last fingerprint offered.
type offer struct {
	ref     node.DeviceRef
	healthy bool
	reason  string
}

// groupOf is one device group being built, with each device's attributes.
type groupOf struct {
	g     *device.DeviceGroup
	attrs []map[string]*structs.Attribute
}

// fingerprint reads the devices as the allocator has them now (its state
// file's health included) and returns their groups: one per model, and one
// per model and MIG profile. It records what it offered for Reserve.
func (st *state) fingerprint() *device.FingerprintResponse {
	resp := &device.FingerprintResponse{}
	if st.alloc == nil {
		return resp
	}
	ignored := map[string]bool{}
	for _, id := range st.cfg.IgnoredGPUIDs {
		ignored[id] = true
	}
	groups := map[string]*groupOf{}
	known := map[string]offer{}
	add := func(name, id, busID string, h node.Health, attrs map[string]*structs.Attribute, ref node.DeviceRef) {
		g := groups[name]
		if g == nil {
			g = &groupOf{g: &device.DeviceGroup{Vendor: Vendor, DeviceType: DeviceType, DeviceName: name}}
			groups[name] = g
		}
		dd := &device.DetectedDevice{ID: id, Healthy: h.Healthy, HealthDescription: h.Reason}
		if busID != "" {
			dd.HwLocality = &device.DeviceLocality{PciBusId: busID}
		}
		g.g.Devices = append(g.g.Devices, dd)
		g.attrs = append(g.attrs, attrs)
		known[id] = offer{ref: ref, healthy: h.Healthy, reason: h.Reason}
	}
	for i, d := range st.alloc.Devices() {
		if ignored[d.UUID] || ignored[strconv.Itoa(d.Index)] || d.UUID == "" {
			continue
		}
		model := d.Model
		if model == "" {
			model = "unknown"
		}
		if d.MIGSplit() {
			if st.cfg.MIG == MIGWhole {
				continue
			}
			for _, m := range d.MIGDevices {
				if ignored[m.UUID] {
					continue
				}
				h := m.Health
				if !d.Health.Healthy {
					h = d.Health
				}
				add(model+" MIG "+m.Profile, m.UUID, d.BusID, h, st.migAttributes(d, m), d.MIGRef(m))
			}
			continue
		}
		if st.cfg.MIG == MIGOnly {
			continue
		}
		add(model, d.UUID, d.BusID, d.Health, st.gpuAttributes(i, d), d.Ref())
	}
	names := make([]string, 0, len(groups))
	for name := range groups {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		g := groups[name]
		g.g.Attributes = common(g.attrs)
		resp.DeviceGroup = append(resp.DeviceGroup, g.g)
	}
	st.mu.Lock()
	st.known = known
	st.mu.Unlock()
	return resp
}

// shared are the attributes every device of the node has.
func (st *state) shared(d node.Device) map[string]*structs.Attribute {
	out := map[string]*structs.Attribute{
		AttrSharing:   stringAttr("exclusive"),
		AttrIsolation: stringAttr(string(st.cfg.Env)),
	}
	if st.inv.DriverVersion != "" {
		out[node.AttrDriverVersion] = stringAttr(st.inv.DriverVersion)
	}
	if v := st.inv.CUDAVersion.String(); v != "" {
		out[AttrCUDAVersion] = stringAttr(v)
	}
	if d.ComputeCapability != "" {
		out[AttrComputeCapability] = stringAttr(d.ComputeCapability)
	}
	if d.Architecture != "" {
		out[AttrArchitecture] = stringAttr(d.Architecture)
	}
	if d.NUMANode != node.NoNUMANode {
		out[AttrNUMANode] = &structs.Attribute{Value: &structs.Attribute_IntVal{IntVal: int64(d.NUMANode)}}
	}
	return out
}

// gpuAttributes are the attributes of the whole GPU at position i.
func (st *state) gpuAttributes(i int, d node.Device) map[string]*structs.Attribute {
	out := st.shared(d)
	for name, a := range d.Attributes {
		if v := attribute(a); v != nil {
			out[name] = v
		}
	}
	nvlink := false
	if t := st.inv.Topology; t != nil {
		for j := range t.Len() {
			if j != i && t.Link(i, j).NVLinks > 0 {
				nvlink = true
			}
		}
	}
	out[AttrNVLink] = boolAttr(nvlink)
	return out
}

// migAttributes are the attributes of MIG device m of d.
func (st *state) migAttributes(d node.Device, m node.MIGDevice) map[string]*structs.Attribute {
	out := st.shared(d)
	out[AttrMIGProfile] = stringAttr(m.Profile)
	if m.MemoryBytes > 0 {
		out[node.AttrMemory] = &structs.Attribute{Value: &structs.Attribute_IntVal{IntVal: int64(m.MemoryBytes >> 20)}, Unit: node.UnitMiB}
	}
	return out
}

// attribute converts a node attribute; one without a value is nil.
func attribute(a node.Attribute) *structs.Attribute {
	switch a.Kind {
	case node.KindInt:
		return &structs.Attribute{Value: &structs.Attribute_IntVal{IntVal: a.Int}, Unit: a.Unit}
	case node.KindString:
		return stringAttr(a.String)
	case node.KindBool:
		return boolAttr(a.Bool)
	}
	return nil
}

func stringAttr(s string) *structs.Attribute {
	return &structs.Attribute{Value: &structs.Attribute_StringVal{StringVal: s}}
}

func boolAttr(b bool) *structs.Attribute {
	return &structs.Attribute{Value: &structs.Attribute_BoolVal{BoolVal: b}}
}

// common returns the attributes every map holds with the same value.
func common(attrs []map[string]*structs.Attribute) map[string]*structs.Attribute {
	if len(attrs) == 0 {
		return nil
	}
	out := map[string]*structs.Attribute{}
	for name, v := range attrs[0] {
		same := true
		for _, m := range attrs[1:] {
			if !proto.Equal(m[name], v) {
				same = false
				break
			}
		}
		if same {
			out[name] = v
		}
	}
	return out
}

// Fingerprint streams the device groups: at once, then again whenever they
// change (a health event, the allocator's state marking a device unhealthy
// or healthy again, a new configuration), read at least every
// fingerprint_period.
func (p *Plugin) Fingerprint(_ *device.FingerprintRequest, stream device.DevicePlugin_FingerprintServer) error {
	ctx := stream.Context()
	var last *device.FingerprintResponse
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
		resp := st.fingerprint()
		st.leave()
		if last == nil || !proto.Equal(resp, last) {
			if err := stream.Send(resp); err != nil {
				return err
			}
			last = resp
		}
		var tick <-chan time.Time
		var t *time.Timer
		if st.alloc != nil {
			t = time.NewTimer(st.cfg.FingerprintPeriod)
			tick = t.C
		}
		select {
		case <-ctx.Done():
			return nil
		case <-wake:
		case <-tick:
		}
		if t != nil {
			t.Stop()
		}
	}
}

func (p *Plugin) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}
