package dra_test

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/kubernetes/dra"
	"github.com/gpuiso/gpuiso/node"
)

// TestHealthTaint: the table of health reasons to taints, as
// nvmlnode's monitor and an operator write reasons.
func TestHealthTaint(t *testing.T) {
	const key = "gpu.gpuiso.io/unhealthy"
	noExec, noSched := resourceapi.DeviceTaintEffectNoExecute, resourceapi.DeviceTaintEffectNoSchedule
	tests := []struct {
		reason, value string
		effect        resourceapi.DeviceTaintEffect
	}{
		{"XID 79", "xid-79", noExec},
		{"xid 79", "xid-79", noExec},
		{"XID 48", "xid-48", noExec},
		{"XID 95", "xid-95", noExec},
		{"XID 64", "xid-64", noExec},
		{"XID 119", "xid-119", noExec},
		{"XID 94", "xid-94", noSched},
		{"XID 63", "xid-63", noSched},
		{"XID 74", "xid-74", noSched},
		{"XID 92", "xid-92", noSched},
		{"double-bit ECC error", "ecc-double-bit", noExec},
		{"GPU is lost", "gpu-lost", noExec},
		{"fallen off the bus", "gpu-lost", noExec},
		{"maintenance: fan replaced", "maintenance--fan-replaced", noSched},
		{"", "unhealthy", noSched},
		{"!!!", "unhealthy", noSched},
	}
	for _, tt := range tests {
		got, ok := dra.HealthTaint(key, node.Unhealthy(tt.reason))
		want := resourceapi.DeviceTaint{Key: key, Value: tt.value, Effect: tt.effect}
		if !ok || got != want {
			t.Errorf("HealthTaint(%q) = %+v, %v; want %+v", tt.reason, got, ok, want)
		}
	}
	if _, ok := dra.HealthTaint(key, node.Healthy()); ok {
		t.Error("a healthy device has a taint")
	}
	for xid := range dra.NoExecuteXIDs() {
		if v := node.DefaultHealthTable().Classify(node.Signal{Kind: node.SignalXID, Value: xid}); v.State != node.StateUnhealthy {
			t.Errorf("XID %d of the NoExecute table does not mark a GPU (%s)", xid, v.State)
		}
	}
	// A signal noted on a device in service is shown, with effect None.
	for reason, value := range map[string]string{
		"XID 94 (contained ECC error): restart-app":          "xid-94",
		"thermal-slowdown (clocks held down for heat): none": "thermal-slowdown--clocks-held-down-for-heat---none",
	} {
		got, ok := dra.HealthTaint(key, node.Health{Healthy: true, Reason: reason})
		want := resourceapi.DeviceTaint{Key: key, Value: value, Effect: resourceapi.DeviceTaintEffectNone}
		if !ok || got.Key != want.Key || got.Effect != want.Effect || (value == "xid-94" && got.Value != value) {
			t.Errorf("HealthTaint(healthy, %q) = %+v, %v; want %+v", reason, got, ok, want)
		}
	}
	// The monitor's reasons keep their taints.
	for _, tt := range []struct {
		xid    uint64
		effect resourceapi.DeviceTaintEffect
	}{{79, noExec}, {48, noExec}, {63, noSched}} {
		v := node.DefaultHealthTable().Classify(node.Signal{Kind: node.SignalXID, Value: tt.xid})
		got, ok := dra.HealthTaint(key, v.Health())
		if !ok || got.Effect != tt.effect || got.Value != fmt.Sprintf("xid-%d", tt.xid) {
			t.Errorf("HealthTaint(%q) = %+v", v.Health().Reason, got)
		}
	}
}

// TestSliceTaints: with a taint key, an unhealthy GPU, MIG device (or a
// MIG device of an unhealthy GPU) and shared GPU stay in the slice with
// their taints, healthy ones have none, and the taint goes with the
// health; without a key they are left out as before.
func TestSliceTaints(t *testing.T) {
	const key = "gpu.gpuiso.io/unhealthy"
	taintsOf := func(devs []resourceapi.Device) map[string][]resourceapi.DeviceTaint {
		out := map[string][]resourceapi.DeviceTaint{}
		for _, d := range devs {
			out[d.Name] = d.Taints
		}
		return out
	}
	_, inv := inventory(t, "dgx1-volta")
	a, err := allocator.New(inv, allocator.WithShared(inv.Devices[3].UUID))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []struct{ dev, why string }{{inv.Devices[2].UUID, "XID 79"}, {inv.Devices[3].UUID, "XID 94"}} {
		if _, err := a.MarkUnhealthy(t.Context(), m.dev, m.why); err != nil {
			t.Fatal(err)
		}
	}
	opts := dra.SliceOptions{Shared: []string{inv.Devices[3].UUID}, TaintKey: key}
	got := taintsOf(dra.Devices(inv, a.Devices(), opts))
	if len(got) != 8 {
		t.Errorf("%d devices published, want 8: %v", len(got), got)
	}
	want := map[string][]resourceapi.DeviceTaint{
		"gpu-2":   {{Key: key, Value: "xid-79", Effect: resourceapi.DeviceTaintEffectNoExecute}},
		"share-3": {{Key: key, Value: "xid-94", Effect: resourceapi.DeviceTaintEffectNoSchedule}},
	}
	for name, taints := range got {
		if len(taints) != len(want[name]) || len(taints) > 0 && taints[0] != want[name][0] {
			t.Errorf("%s: taints %+v, want %+v", name, taints, want[name])
		}
	}
	opts.TaintKey = ""
	if got := taintsOf(dra.Devices(inv, a.Devices(), opts)); len(got) != 6 || got["gpu-2"] != nil || got["share-3"] != nil {
		t.Errorf("without a taint key: %v, want the 6 healthy devices", got)
	}
	opts.TaintKey = key
	if err := a.MarkHealthy(t.Context(), inv.Devices[2].UUID); err != nil {
		t.Fatal(err)
	}
	if got := taintsOf(dra.Devices(inv, a.Devices(), opts)); len(got["gpu-2"]) != 0 {
		t.Errorf("gpu-2 healthy again keeps taints %+v", got["gpu-2"])
	}

	_, inv = inventory(t, "hgx-h100-mig")
	a, err = allocator.New(inv)
	if err != nil {
		t.Fatal(err)
	}
	var parent node.Device
	for _, d := range inv.Devices {
		if d.MIGSplit() && len(d.MIGDevices) >= 2 {
			parent = d
			break
		}
	}
	one := parent.MIGDevices[0]
	if _, err := a.MarkUnhealthy(t.Context(), one.UUID, "XID 48"); err != nil {
		t.Fatal(err)
	}
	got = taintsOf(dra.Devices(inv, a.Devices(), dra.SliceOptions{TaintKey: key}))
	if ts := got[dra.MIGDeviceName(one)]; len(ts) != 1 || ts[0].Value != "xid-48" || ts[0].Effect != resourceapi.DeviceTaintEffectNoExecute {
		t.Errorf("unhealthy MIG device: taints %+v", ts)
	}
	if ts := got[dra.MIGDeviceName(parent.MIGDevices[1])]; len(ts) != 0 {
		t.Errorf("its healthy sibling: taints %+v", ts)
	}
	if _, err := a.MarkUnhealthy(t.Context(), parent.UUID, "GPU is lost"); err != nil {
		t.Fatal(err)
	}
	got = taintsOf(dra.Devices(inv, a.Devices(), dra.SliceOptions{TaintKey: key}))
	for _, m := range parent.MIGDevices {
		if ts := got[dra.MIGDeviceName(m)]; len(ts) == 0 || ts[len(ts)-1].Value != "gpu-lost" {
			t.Errorf("MIG device %s of a lost GPU: taints %+v", dra.MIGDeviceName(m), ts)
		}
	}
}

// tolerating is claim with tols on each of its results.
func tolerating(c *resourceapi.ResourceClaim, tols ...resourceapi.DeviceToleration) *resourceapi.ResourceClaim {
	for i := range c.Status.Allocation.Devices.Results {
		c.Status.Allocation.Devices.Results[i].Tolerations = tols
	}
	return c
}

// TestPrepareTainted: Prepare refuses an unhealthy device to a claim that
// does not tolerate its taint (ErrUntolerated, nothing held), and
// prepares it for one that does; a driver that publishes no taints
// refuses every unhealthy device.
func TestPrepareTainted(t *testing.T) {
	e := newEnv(t, "dgx1-volta")
	d, a := e.driver(t)
	lost := e.inv.Devices[1]
	if _, err := a.MarkUnhealthy(t.Context(), lost.UUID, "XID 79"); err != nil {
		t.Fatal(err)
	}
	exists := resourceapi.DeviceToleration{Key: "gpu.gpuiso.io/unhealthy", Operator: resourceapi.DeviceTolerationOpExists}
	noSchedule := exists
	noSchedule.Effect = resourceapi.DeviceTaintEffectNoSchedule
	otherValue := resourceapi.DeviceToleration{Key: "gpu.gpuiso.io/unhealthy", Value: "xid-48"}
	for name, c := range map[string]*resourceapi.ResourceClaim{
		"no toleration":          claim("u1", "gpu-1"),
		"NoSchedule only":        tolerating(claim("u2", "gpu-1"), noSchedule),
		"another value":          tolerating(claim("u3", "gpu-1"), otherValue),
		"one of two tolerated":   tolerating(claim("u4", "gpu-1", "gpu-2"), noSchedule),
		"another driver's taint": tolerating(claim("u5", "gpu-1"), resourceapi.DeviceToleration{Key: "example.com/unhealthy", Operator: resourceapi.DeviceTolerationOpExists}),
	} {
		if _, err := d.Prepare(t.Context(), c); !errors.Is(err, dra.ErrUntolerated) || !errors.Is(err, node.ErrUnavailable) {
			t.Errorf("%s: %v, want ErrUntolerated", name, err)
		}
		e.checkGone(t, d, a, string(c.UID))
	}
	c := tolerating(claim("diag", "gpu-1", "gpu-2"), exists)
	devs, err := d.Prepare(t.Context(), c)
	if err != nil {
		t.Fatal(err)
	}
	e.checkPrepared(t, d, a, "diag", devs, []string{lost.UUID, e.inv.Devices[2].UUID})
	if h := a.Devices()[1].Health; h.Healthy {
		t.Error("preparing the tolerating claim made the GPU healthy")
	}
	if err := d.Unprepare(t.Context(), "diag"); err != nil {
		t.Fatal(err)
	}
	exact := tolerating(claim("exact", "gpu-1"), resourceapi.DeviceToleration{Key: "gpu.gpuiso.io/unhealthy", Value: "xid-79", Effect: resourceapi.DeviceTaintEffectNoExecute})
	if _, err := d.Prepare(t.Context(), exact); err != nil {
		t.Errorf("a toleration of exactly the taint: %v", err)
	}
	if err := d.Unprepare(t.Context(), "exact"); err != nil {
		t.Fatal(err)
	}

	if err := os.MkdirAll(e.cdiDir, 0o755); err != nil {
		t.Fatal(err)
	}
	old, err := dra.New(e.inv, a, dra.Config{CDIDir: e.cdiDir, StateDir: e.stateDir, LeaveOutUnhealthy: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := old.Prepare(t.Context(), tolerating(claim("u6", "gpu-1"), exists)); !errors.Is(err, dra.ErrUntolerated) {
		t.Errorf("no taints published, a tolerating claim: %v, want ErrUntolerated", err)
	}
	for _, dev := range old.Resources("node-1").Pools["node-1"].Slices[0].Devices {
		if dev.Name == "gpu-1" {
			t.Error("LeaveOutUnhealthy publishes the unhealthy gpu-1")
		}
	}
}

// TestHeldTaint: a device the allocator holds for an owner that is no
// claim of the driver's (a device plugin's pod on the same allocator) is
// published with HeldTaint, NoSchedule, so that the scheduler allocates it
// to no claim Prepare would refuse; a device a claim of the driver's holds
// is not; the taint goes when the other owner lets the device go.
func TestHeldTaint(t *testing.T) {
	e := newEnv(t, "dgx1-volta")
	d, a := e.driver(t)
	ctx := t.Context()
	if _, err := a.Claim(ctx, "deviceplugin-"+e.inv.Devices[2].UUID, []node.DeviceRef{e.inv.Devices[2].Ref()}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Prepare(ctx, claim("u-held", "gpu-3")); err != nil {
		t.Fatal(err)
	}
	taints := func() map[string][]resourceapi.DeviceTaint {
		out := map[string][]resourceapi.DeviceTaint{}
		for _, s := range d.Resources("n").Pools["n"].Slices {
			for _, dev := range s.Devices {
				out[dev.Name] = dev.Taints
			}
		}
		return out
	}
	want := resourceapi.DeviceTaint{Key: "gpu.gpuiso.io/held", Value: "held", Effect: resourceapi.DeviceTaintEffectNoSchedule}
	if got := dra.HeldTaint(dra.TaintKey(dra.DefaultDriverName)); got != want {
		t.Fatalf("HeldTaint = %+v, want %+v", got, want)
	}
	got := taints()
	if ts := got["gpu-2"]; len(ts) != 1 || ts[0] != want {
		t.Errorf("gpu-2, held for the device plugin: taints %+v, want %+v", ts, want)
	}
	for name, ts := range got {
		if name != "gpu-2" && len(ts) != 0 {
			t.Errorf("%s: taints %+v, want none", name, ts)
		}
	}
	// A claim of the held GPU is refused by Prepare (which is why it is
	// tainted); an admin claim, which takes nothing, is prepared.
	if _, err := d.Prepare(ctx, claim("u-late", "gpu-2")); err == nil {
		t.Error("a claim of the GPU held for the device plugin was prepared")
	}
	if _, err := d.Prepare(ctx, adminClaim("u-admin", "gpu-2")); err != nil {
		t.Errorf("an admin claim of the held GPU: %v", err)
	}
	if err := a.Release(ctx, "deviceplugin-"+e.inv.Devices[2].UUID); err != nil {
		t.Fatal(err)
	}
	if ts := taints()["gpu-2"]; len(ts) != 0 {
		t.Errorf("gpu-2 let go keeps taints %+v", ts)
	}
}

// TestHealthTaintEffects: the effect of a reason the health monitor wrote
// follows the table's action: a note None, restart-app and drain
// NoSchedule, a reset or a reboot NoExecute with the reset on and,
// without it, NoExecute only where the signal leaves the work dead.
func TestHealthTaintEffects(t *testing.T) {
	const key = "gpu.gpuiso.io/unhealthy"
	none, noExec, noSched := resourceapi.DeviceTaintEffectNone, resourceapi.DeviceTaintEffectNoExecute, resourceapi.DeviceTaintEffectNoSchedule
	table := node.DefaultHealthTable()
	signal := func(text string) node.Signal {
		s, err := node.ParseSignal(text)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	verdict := func(text string) node.Health { return table.Classify(signal(text)).Health() }
	// note is the health of a device in service with an informing
	// signal noted (allocator.Inform).
	note := func(text string) node.Health {
		return node.Health{Healthy: true, Reason: table.Classify(signal(text)).String()}
	}
	override := func(rule string) node.Health {
		rules, err := node.ParseHealthRules(rule)
		if err != nil {
			t.Fatal(err)
		}
		f := strings.Fields(rule)
		return append(node.DefaultHealthTable(), rules...).Classify(signal(f[0] + " " + f[1])).Health()
	}
	tests := []struct {
		name    string
		health  node.Health
		off, on resourceapi.DeviceTaintEffect
		value   string
	}{
		{name: "xid 109 reset", health: verdict("xid 109"), off: noSched, on: noExec, value: "xid-109"},
		{name: "xid 74 reset", health: verdict("xid 74"), off: noSched, on: noExec, value: "xid-74"},
		{name: "xid 79 reset, work dead", health: verdict("xid 79"), off: noExec, on: noExec, value: "xid-79"},
		{name: "xid 48 reset, work dead", health: verdict("xid 48"), off: noExec, on: noExec, value: "xid-48"},
		{name: "ecc reset, work dead", health: verdict("ecc-double-bit"), off: noExec, on: noExec, value: "ecc-double-bit"},
		{name: "lost reset, work dead", health: verdict("lost"), off: noExec, on: noExec, value: "gpu-lost"},
		{name: "recovery action reset", health: verdict("recovery-action 1"), off: noSched, on: noExec},
		{name: "recovery action reboot", health: verdict("recovery-action 2"), off: noSched, on: noExec},
		{name: "row remap pending reset", health: verdict("row-remap-pending"), off: noSched, on: noExec},
		{name: "xid 63 drain", health: verdict("xid 63"), off: noSched, on: noSched, value: "xid-63"},
		{name: "nvlink down drain", health: verdict("nvlink-down 2"), off: noSched, on: noSched},
		{name: "unknown xid drain", health: verdict("xid 31337"), off: noSched, on: noSched, value: "xid-31337"},
		{name: "xid 79 overridden to drain", health: override("xid 79 unhealthy drain"), off: noSched, on: noSched, value: "xid-79"},
		{name: "xid 94 overridden to unhealthy restart-app", health: override("xid 94 unhealthy restart-app"), off: noSched, on: noSched, value: "xid-94"},
		{name: "xid 109 reset failed", health: node.Unhealthy("XID 109 (context switch timeout), reset failed: reboot"), off: noSched, on: noExec, value: "xid-109"},
		{name: "xid 94 inform", health: note("xid 94"), off: none, on: none, value: "xid-94"},
		{name: "thermal inform", health: note("thermal-slowdown"), off: none, on: none},
		{name: "operator reason", health: node.Unhealthy("maintenance"), off: noSched, on: noSched, value: "maintenance"},
		{name: "operator XID 79", health: node.Unhealthy("XID 79"), off: noExec, on: noExec, value: "xid-79"},
		{name: "operator XID 109", health: node.Unhealthy("XID 109"), off: noSched, on: noSched, value: "xid-109"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := tt.health
			for _, reset := range []bool{false, true} {
				want := tt.off
				if reset {
					want = tt.on
				}
				got, ok := dra.HealthTaintOf(key, h, reset)
				if !ok || got.Effect != want || got.Key != key || (tt.value != "" && got.Value != tt.value) {
					t.Errorf("reset %v: %q: %+v, %v; want effect %s, value %q", reset, h.Reason, got, ok, want, tt.value)
				}
			}
			if got, _ := dra.HealthTaint(key, h); got.Effect != tt.off {
				t.Errorf("HealthTaint: %s, want %s", got.Effect, tt.off)
			}
		})
	}
	if _, ok := dra.HealthTaintOf(key, node.Healthy(), true); ok {
		t.Error("a healthy device has a taint")
	}
}

// TestSliceEvictForReset: with EvictForReset, a GPU waiting for its reset
// is published NoExecute; without it, NoSchedule.
func TestSliceEvictForReset(t *testing.T) {
	const key = "gpu.gpuiso.io/unhealthy"
	_, inv := inventory(t, "dgx1-volta")
	a, err := allocator.New(inv)
	if err != nil {
		t.Fatal(err)
	}
	v := node.DefaultHealthTable().Classify(node.Signal{Kind: node.SignalXID, Value: 109})
	if _, err := a.MarkUnhealthy(t.Context(), inv.Devices[2].UUID, v.String()); err != nil {
		t.Fatal(err)
	}
	for _, reset := range []bool{false, true} {
		want := resourceapi.DeviceTaintEffectNoSchedule
		if reset {
			want = resourceapi.DeviceTaintEffectNoExecute
		}
		for _, d := range dra.Devices(inv, a.Devices(), dra.SliceOptions{TaintKey: key, EvictForReset: reset}) {
			switch {
			case d.Name == "gpu-2" && (len(d.Taints) != 1 || d.Taints[0].Effect != want):
				t.Errorf("reset %v: gpu-2 taints %+v, want one %s", reset, d.Taints, want)
			case d.Name != "gpu-2" && len(d.Taints) != 0:
				t.Errorf("reset %v: %s tainted: %+v", reset, d.Name, d.Taints)
			}
		}
	}
}
