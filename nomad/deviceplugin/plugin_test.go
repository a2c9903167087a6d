package deviceplugin_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/zclconf/go-cty/cty"
	ctymsgpack "github.com/zclconf/go-cty/cty/msgpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/nomad/internal/hclspecutil"
	"github.com/gpuiso/gpuiso/nomad/internal/proto/base"
	"github.com/gpuiso/gpuiso/nomad/internal/proto/device"
	"github.com/gpuiso/gpuiso/nomad/internal/proto/structs"
)

// TestInfoAndSchema: the program is a device plugin of API v0.1.0 named
// gpuiso, and its schema has exactly the documented keys.
func TestInfoAndSchema(t *testing.T) {
	l := launch(t)
	ctx := context.Background()
	info, err := l.base.PluginInfo(ctx, &base.PluginInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if info.GetType() != base.PluginType_DEVICE || !slices.Equal(info.GetPluginApiVersions(), []string{"v0.1.0"}) || info.GetName() != "gpuiso" {
		t.Fatalf("plugin info %v", info)
	}
	schema, err := l.base.ConfigSchema(ctx, &base.ConfigSchemaRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for k := range schema.GetSpec().GetObject().GetAttributes() {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	want := []string{"dev_root", "driver_root", "enabled", "env", "fingerprint_period", "ignored_gpu_ids", "mig", "nomad_addr", "nomad_token", "simulate", "state_dir"}
	if !slices.Equal(keys, want) {
		t.Fatalf("schema keys %v, want %v", keys, want)
	}
}

// withKey returns the msgpack config Nomad would send for config, with
// key set to v as well, bypassing Nomad's own check of the block.
func withKey(t *testing.T, spec *base.ConfigSchemaResponse, config map[string]any, key string, v cty.Value) []byte {
	t.Helper()
	data, err := hclspecutil.Encode(spec.GetSpec(), config)
	if err != nil {
		t.Fatal(err)
	}
	ty, err := ctymsgpack.ImpliedType(data)
	if err != nil {
		t.Fatal(err)
	}
	val, err := ctymsgpack.Unmarshal(data, ty)
	if err != nil {
		t.Fatal(err)
	}
	attrs := val.AsValueMap()
	attrs[key] = v
	obj := cty.ObjectVal(attrs)
	out, err := ctymsgpack.Marshal(obj, obj.Type())
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestSetConfigRefused: an unknown key, a value of the wrong type, a bad
// value of each key and an API version the plugin does not speak are
// refused with a message naming what is wrong.
func TestSetConfigRefused(t *testing.T) {
	l := launch(t)
	ctx := context.Background()
	schema, err := l.base.ConfigSchema(ctx, &base.ConfigSchemaRequest{})
	if err != nil {
		t.Fatal(err)
	}
	encode := func(config map[string]any) []byte {
		data, err := hclspecutil.Encode(schema.GetSpec(), config)
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	for _, tc := range []struct {
		name    string
		data    []byte
		version string
		code    codes.Code
		want    string
	}{
		{"unknown key", withKey(t, schema, nil, "gpus", cty.StringVal("all")), "v0.1.0", codes.InvalidArgument, `"gpus"`},
		{"wrong type", withKey(t, schema, nil, "enabled", cty.StringVal("maybe")), "v0.1.0", codes.InvalidArgument, "invalid plugin configuration"},
		{"env", encode(map[string]any{"env": "cdi"}), "v0.1.0", codes.InvalidArgument, "env"},
		{"mig", encode(map[string]any{"mig": "half"}), "v0.1.0", codes.InvalidArgument, "mig"},
		{"period", encode(map[string]any{"fingerprint_period": "soon"}), "v0.1.0", codes.InvalidArgument, "fingerprint_period"},
		{"negative period", encode(map[string]any{"fingerprint_period": "-1s"}), "v0.1.0", codes.InvalidArgument, "fingerprint_period"},
		{"simulate", encode(map[string]any{"simulate": "dgx-9000", "dev_root": "/tmp/x"}), "v0.1.0", codes.InvalidArgument, "simulate"},
		{"simulate without dev_root", encode(map[string]any{"simulate": "dgx1-volta"}), "v0.1.0", codes.InvalidArgument, "dev_root"},
		{"relative state_dir", encode(map[string]any{"state_dir": "state"}), "v0.1.0", codes.InvalidArgument, "state_dir"},
		{"empty ignored id", encode(map[string]any{"ignored_gpu_ids": []string{""}}), "v0.1.0", codes.InvalidArgument, "ignored_gpu_ids"},
		{"nomad_addr", encode(map[string]any{"nomad_addr": "ftp://nomad"}), "v0.1.0", codes.InvalidArgument, "nomad_addr"},
		{"api version", encode(nil), "v0.2.0", codes.Unimplemented, "v0.2.0"},
		{"garbage", []byte{0xc1, 0x00}, "v0.1.0", codes.InvalidArgument, "invalid plugin configuration"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := l.base.SetConfig(ctx, &base.SetConfigRequest{MsgpackConfig: tc.data, PluginApiVersion: tc.version})
			if status.Code(err) != tc.code || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("SetConfig: %v, want %v naming %s", err, tc.code, tc.want)
			}
		})
	}
	// Nomad refuses an unknown key before the plugin sees it: the schema
	// is what its parser checks the block against.
	if _, err := hclspecutil.Encode(schema.GetSpec(), map[string]any{"gpus": "all"}); err == nil {
		t.Fatal("the schema accepts an unknown key")
	}
	// Nothing was put in force.
	s, err := l.device.Fingerprint(ctx, &device.FingerprintRequest{})
	if err == nil {
		_, err = s.Recv()
	}
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("fingerprint of an unconfigured plugin: %v", err)
	}
}

// group returns the group named name.
func group(resp *device.FingerprintResponse, name string) *device.DeviceGroup {
	for _, g := range resp.GetDeviceGroup() {
		if g.GetDeviceName() == name {
			return g
		}
	}
	return nil
}

func stringAttr(g *device.DeviceGroup, name string) string {
	return g.GetAttributes()[name].GetStringVal()
}

// TestFingerprint: one group per model, each GPU by UUID with its bus id
// and health, the group's attributes in Nomad's units.
func TestFingerprint(t *testing.T) {
	s := simulate(t, "dgx1-volta")
	l := load(t, s.config(nil))
	fp := l.fingerprints(t).until(t, "a fingerprint", func(*device.FingerprintResponse) bool { return true })
	model := s.inv.Devices[0].Model
	if len(fp.GetDeviceGroup()) != 1 {
		t.Fatalf("groups %v", fp.GetDeviceGroup())
	}
	g := group(fp, model)
	if g == nil || g.GetVendor() != "nvidia" || g.GetDeviceType() != "gpu" || len(g.GetDevices()) != len(s.inv.Devices) {
		t.Fatalf("group %v", g)
	}
	for i, d := range g.GetDevices() {
		want := s.inv.Devices[i]
		if d.GetID() != want.UUID || !d.GetHealthy() || d.GetHwLocality().GetPciBusId() != want.BusID {
			t.Errorf("device %d: %v, want %s at %s", i, d, want.UUID, want.BusID)
		}
	}
	attrs := g.GetAttributes()
	mem := attrs["memory"]
	if mem.GetIntVal() != int64(want(t, s.inv.Devices[0].MemoryBytes>>20)) || mem.GetUnit() != "MiB" {
		t.Errorf("memory %v", mem)
	}
	for name, v := range map[string]string{
		"compute_capability": s.inv.Devices[0].ComputeCapability,
		"driver_version":     s.inv.DriverVersion,
		"cuda_version":       s.inv.CUDAVersion.String(),
		"architecture":       "volta",
		"sharing":            "exclusive",
		"isolation":          "devices",
	} {
		if got := stringAttr(g, name); got != v || v == "" {
			t.Errorf("attribute %s = %q, want %q", name, got, v)
		}
	}
	if !attrs["nvlink"].GetBoolVal() {
		t.Errorf("nvlink %v", attrs["nvlink"])
	}
	if p := attrs["power"]; p.GetUnit() != "W" || p.GetIntVal() <= 0 {
		t.Errorf("power %v", p)
	}
	if _, ok := attrs["numa_node"]; ok {
		t.Errorf("numa_node %v on GPUs of two NUMA nodes", attrs["numa_node"])
	}
}

func want(t *testing.T, v uint64) uint64 {
	t.Helper()
	if v == 0 {
		t.Fatal("zero expectation")
	}
	return v
}

// TestFingerprintMIG: on a node with MIG devices, a group per model for the
// whole GPUs and one per model and profile for the MIG devices, as the
// mig key asks.
func TestFingerprintMIG(t *testing.T) {
	s := simulate(t, "hgx-h100-mig")
	var whole []string
	migs := map[string][]string{} // profile: UUIDs
	for i, d := range s.inv.Devices {
		if !d.MIGSplit() {
			whole = append(whole, d.UUID)
			continue
		}
		for _, m := range s.sim.MIGDevices(i) {
			migs[m.Profile] = append(migs[m.Profile], m.UUID)
		}
	}
	if len(whole) == 0 || len(migs) == 0 {
		t.Fatalf("node without both kinds: %d whole, %v", len(whole), migs)
	}
	model := s.inv.Devices[0].Model
	ids := func(g *device.DeviceGroup) []string {
		var out []string
		for _, d := range g.GetDevices() {
			out = append(out, d.GetID())
		}
		slices.Sort(out)
		return out
	}
	for _, mode := range []string{"both", "whole", "mig"} {
		t.Run(mode, func(t *testing.T) {
			l := load(t, s.config(map[string]any{"mig": mode}))
			fp := l.fingerprints(t).until(t, "a fingerprint", func(*device.FingerprintResponse) bool { return true })
			wantGroups := 0
			if mode != "mig" {
				wantGroups++
				g := group(fp, model)
				w := slices.Sorted(slices.Values(whole))
				if g == nil || !slices.Equal(ids(g), w) {
					t.Fatalf("whole GPUs %v, want %v", g, w)
				}
			}
			if mode != "whole" {
				for profile, uuids := range migs {
					wantGroups++
					g := group(fp, model+" MIG "+profile)
					w := slices.Sorted(slices.Values(uuids))
					if g == nil || !slices.Equal(ids(g), w) {
						t.Fatalf("MIG %s: %v, want %v", profile, g, w)
					}
					if stringAttr(g, "mig_profile") != profile || g.GetAttributes()["memory"].GetUnit() != "MiB" {
						t.Errorf("MIG %s attributes %v", profile, g.GetAttributes())
					}
				}
			}
			if len(fp.GetDeviceGroup()) != wantGroups {
				t.Fatalf("%d groups, want %d: %v", len(fp.GetDeviceGroup()), wantGroups, fp.GetDeviceGroup())
			}
		})
	}
}

// health returns the fingerprint's health of device id.
func health(fp *device.FingerprintResponse, id string) (*device.DetectedDevice, bool) {
	for _, g := range fp.GetDeviceGroup() {
		for _, d := range g.GetDevices() {
			if d.GetID() == id {
				return d, true
			}
		}
	}
	return nil, false
}

// TestHealth: a GPU another process marks unhealthy in the allocator's
// state shows unhealthy in the stream, with the reason, and healthy again
// once marked healthy there.
func TestHealth(t *testing.T) {
	s := simulate(t, "dgx1-volta")
	l := load(t, s.config(nil))
	fps := l.fingerprints(t)
	id := s.inv.Devices[2].UUID
	fps.until(t, "GPU 2 healthy", func(fp *device.FingerprintResponse) bool {
		d, ok := health(fp, id)
		return ok && d.GetHealthy()
	})
	a := s.allocator(t)
	ctx := context.Background()
	if _, err := a.MarkUnhealthy(ctx, id, "XID 48: double-bit ECC error"); err != nil {
		t.Fatal(err)
	}
	fp := fps.until(t, "GPU 2 unhealthy", func(fp *device.FingerprintResponse) bool {
		d, ok := health(fp, id)
		return ok && !d.GetHealthy()
	})
	d, _ := health(fp, id)
	if !strings.Contains(d.GetHealthDescription(), "XID 48") {
		t.Errorf("description %q", d.GetHealthDescription())
	}
	for i, dev := range s.inv.Devices {
		if d, _ := health(fp, dev.UUID); i != 2 && !d.GetHealthy() {
			t.Errorf("GPU %d unhealthy too: %v", i, d)
		}
	}
	// Nomad would not place on it; a Reserve that names it is refused.
	_, err := l.device.Reserve(ctx, &device.ReserveRequest{DeviceIds: []string{id}})
	if status.Code(err) != codes.FailedPrecondition {
		t.Errorf("reserve of the unhealthy GPU: %v", err)
	}
	if err := a.MarkHealthy(ctx, id); err != nil {
		t.Fatal(err)
	}
	fps.until(t, "GPU 2 healthy again", func(fp *device.FingerprintResponse) bool {
		d, ok := health(fp, id)
		return ok && d.GetHealthy() && d.GetHealthDescription() == ""
	})
}

// TestReconfigureRefusedKeepsConfig: a refused SetConfig leaves the
// configuration in force as it was.
func TestReconfigureRefusedKeepsConfig(t *testing.T) {
	s := simulate(t, "dgx1-volta")
	l := load(t, s.config(map[string]any{"env": "runtime"}))
	if err := l.configure(s.config(map[string]any{"env": "devices", "fingerprint_period": "soon"}), ""); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("bad reconfiguration: %v", err)
	}
	// Checked, but the node cannot be opened: a host tree directory
	// holding files gpuiso did not make.
	foreign := t.TempDir()
	if err := os.WriteFile(filepath.Join(foreign, "notes"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := l.configure(s.config(map[string]any{"env": "devices", "dev_root": foreign}), ""); status.Code(err) != codes.AlreadyExists || !strings.Contains(err.Error(), "not made by gpuiso") {
		t.Fatalf("a host tree of foreign files: %v", err)
	}
	fps := l.fingerprints(t)
	fp := fps.until(t, "a fingerprint", func(*device.FingerprintResponse) bool { return true })
	g := group(fp, s.inv.Devices[0].Model)
	if g == nil || stringAttr(g, "isolation") != "runtime" || len(g.GetDevices()) != len(s.inv.Devices) {
		t.Fatalf("after refused reconfigurations: %v", fp)
	}
	// One that takes is seen by the open stream.
	if err := l.configure(s.config(map[string]any{"env": "devices"}), ""); err != nil {
		t.Fatal(err)
	}
	fps.until(t, "devices mode", func(fp *device.FingerprintResponse) bool {
		g := group(fp, s.inv.Devices[0].Model)
		return g != nil && stringAttr(g, "isolation") == "devices"
	})
	// Disabled: no device, and no reservation.
	if err := l.configure(s.config(map[string]any{"enabled": false}), ""); err != nil {
		t.Fatal(err)
	}
	fps.until(t, "no device", func(fp *device.FingerprintResponse) bool { return len(fp.GetDeviceGroup()) == 0 })
	_, err := l.device.Reserve(context.Background(), &device.ReserveRequest{DeviceIds: []string{s.inv.Devices[0].UUID}})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "disabled") {
		t.Fatalf("reserve on a disabled plugin: %v", err)
	}
}

// TestStats: every device's memory (used / total, MiB) is the summary.
func TestStats(t *testing.T) {
	s := simulate(t, "dgx1-volta")
	l := load(t, s.config(nil))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := l.device.Stats(ctx, &device.StatsRequest{CollectionInterval: durationpb.New(100 * time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetGroups()) != 1 {
		t.Fatalf("stats groups %v", resp.GetGroups())
	}
	g := resp.GetGroups()[0]
	total := int64(s.inv.Devices[0].MemoryBytes >> 20)
	if g.GetName() != s.inv.Devices[0].Model || len(g.GetInstanceStats()) != len(s.inv.Devices) {
		t.Fatalf("group %v", g)
	}
	for _, d := range s.inv.Devices {
		ds := g.GetInstanceStats()[d.UUID]
		sum := ds.GetSummary()
		if sum.GetIntDenominatorVal().GetValue() != total || sum.GetIntNumeratorVal() == nil || sum.GetUnit() != "MiB" || ds.GetTimestamp() == nil {
			t.Errorf("%s: %v", d.UUID, ds)
		}
		if !proto3Equal(ds.GetStats().GetAttributes()["memory"], sum) {
			t.Errorf("%s: memory stat %v", d.UUID, ds.GetStats())
		}
	}
}

func proto3Equal(a, b *structs.StatValue) bool {
	return a.GetIntNumeratorVal().GetValue() == b.GetIntNumeratorVal().GetValue() && a.GetIntDenominatorVal().GetValue() == b.GetIntDenominatorVal().GetValue() && a.GetUnit() == b.GetUnit()
}

// TestReserveRuntime: in runtime mode a reservation is
// NVIDIA_VISIBLE_DEVICES alone, and the plugin holds nothing
// (gpuiso-runtime does, for the container's life).
func TestReserveRuntime(t *testing.T) {
	s := simulate(t, "dgx1-volta")
	l := load(t, s.config(map[string]any{"env": "runtime"}))
	l.fingerprints(t).until(t, "a fingerprint", func(*device.FingerprintResponse) bool { return true })
	ids := []string{s.inv.Devices[1].UUID, s.inv.Devices[6].UUID}
	res, err := l.device.Reserve(context.Background(), &device.ReserveRequest{DeviceIds: ids})
	if err != nil {
		t.Fatal(err)
	}
	cr := res.GetContainerRes()
	if len(cr.GetEnvs()) != 1 || cr.GetEnvs()["NVIDIA_VISIBLE_DEVICES"] != strings.Join(ids, ",") || len(cr.GetDevices()) != 0 || len(cr.GetMounts()) != 0 {
		t.Fatalf("reservation %v", cr)
	}
	if al := s.allocator(t).Allocations(); len(al) != 0 {
		t.Fatalf("held in runtime mode: %v", al)
	}
}

// TestReserveRefused: no device, a device twice, a device the fingerprint
// does not hold, and one another user of the state holds are refused, and
// nothing is held.
func TestReserveRefused(t *testing.T) {
	s := simulate(t, "dgx1-volta")
	l := load(t, s.config(nil))
	l.fingerprints(t).until(t, "a fingerprint", func(*device.FingerprintResponse) bool { return true })
	a := s.allocator(t)
	ctx := context.Background()
	if _, err := a.Claim(ctx, "gpurun-1", []node.DeviceRef{s.inv.Devices[4].Ref()}); err != nil {
		t.Fatal(err)
	}
	u := func(i int) string { return s.inv.Devices[i].UUID }
	for _, tc := range []struct {
		name string
		ids  []string
		code codes.Code
		want string
	}{
		{"none", nil, codes.InvalidArgument, "no device"},
		{"twice", []string{u(0), u(0)}, codes.InvalidArgument, "named twice"},
		{"unknown", []string{u(0), "GPU-00000000-0000-0000-0000-000000000000"}, codes.NotFound, "unknown device"},
		{"index", []string{"0"}, codes.NotFound, "unknown device"},
		{"held elsewhere", []string{u(3), u(4)}, codes.FailedPrecondition, "held"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := l.device.Reserve(ctx, &device.ReserveRequest{DeviceIds: tc.ids})
			if status.Code(err) != tc.code || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Reserve(%v): %v, want %v %q", tc.ids, err, tc.code, tc.want)
			}
		})
	}
	for _, al := range a.Allocations() {
		if al.Owner != "gpurun-1" {
			t.Errorf("held after refusals: %v", al)
		}
	}
	if _, err := a.Allocate(ctx, "gpurun-2", allocator.Request{Count: 7}); err != nil {
		t.Errorf("the other 7 GPUs are not free: %v", err)
	}
}

// TestIgnoredGPUs: GPUs named in ignored_gpu_ids, by UUID or index, are
// not offered, and cannot be reserved.
func TestIgnoredGPUs(t *testing.T) {
	s := simulate(t, "dgx1-volta")
	ignored := s.inv.Devices[1].UUID
	l := load(t, s.config(map[string]any{"ignored_gpu_ids": []string{ignored, "5"}}))
	fp := l.fingerprints(t).until(t, "a fingerprint", func(*device.FingerprintResponse) bool { return true })
	var ids []string
	for _, g := range fp.GetDeviceGroup() {
		for _, d := range g.GetDevices() {
			ids = append(ids, d.GetID())
		}
	}
	var want []string
	for i, d := range s.inv.Devices {
		if i != 1 && i != 5 {
			want = append(want, d.UUID)
		}
	}
	if !slices.Equal(ids, want) {
		t.Fatalf("offered %v, want %v", ids, want)
	}
	_, err := l.device.Reserve(context.Background(), &device.ReserveRequest{DeviceIds: []string{ignored}})
	if status.Code(err) != codes.NotFound {
		t.Fatalf("reserve of an ignored GPU: %v", err)
	}
}
