package dra_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/kubernetes/dra"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
)

// dynEnv is an hgx-h100-dynmig node with its host tree (GPU 0: MIG
// enabled, no instance; GPU 1: a user's 3g.40gb at slice 0), both GPUs
// partitioned by dynamic MIG.
type dynEnv struct {
	*env
	host *simnode.Host
}

func newDynEnv(t *testing.T) *dynEnv {
	t.Helper()
	sim, host, inv := testenv.SimulatedNode(t, "hgx-h100-dynmig")
	dir := t.TempDir()
	return &dynEnv{env: &env{sim: sim, inv: inv, stateDir: filepath.Join(dir, "claims"), allocDir: filepath.Join(dir, "alloc"), cdiDir: filepath.Join(dir, "cdi")}, host: host}
}

// driver starts a driver as a (re)started plugin would: the node
// discovered again (the MIG devices made before are there now), a new
// allocator on the same state with the node's MIG manager, and Restore.
func (e *dynEnv) driver(t *testing.T) (*dra.Driver, *allocator.Allocator) {
	t.Helper()
	return e.driverWith(t, func(m *simnode.MIGManager) allocator.MIGManager { return m }, nil)
}

// driverWith is driver with the node's MIG manager as wrap returns it and
// destroyer as the driver's Config.MIGDestroyer.
func (e *dynEnv) driverWith(t *testing.T, wrap func(*simnode.MIGManager) allocator.MIGManager, destroyer dra.MIGPlacementDestroyer) (*dra.Driver, *allocator.Allocator) {
	t.Helper()
	for _, d := range []string{e.allocDir, e.cdiDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	inv, err := nvmlnode.Discover(context.Background(), e.sim.DiscoverOptions(e.host)...)
	if err != nil {
		t.Fatal(err)
	}
	a, err := allocator.New(inv, allocator.WithStateDir(e.allocDir), allocator.WithMIGManager(wrap(e.sim.MIGManager(e.host))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	d, err := dra.New(inv, a, dra.Config{CDIDir: e.cdiDir, StateDir: e.stateDir, Slice: dra.SliceOptions{DynamicMIG: []string{e.sim.UUID(0), e.sim.UUID(1)}},
		MIGDestroyer: destroyer})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Restore(context.Background()); err != nil {
		t.Fatal(err)
	}
	return d, a
}

// inventory is the node discovered without a host tree, for slice tests.
func dynInventory(t *testing.T) (*simnode.Node, *node.Inventory) {
	t.Helper()
	sim, err := simnode.New("hgx-h100-dynmig", simnode.WithDriverVersion("580.159.04"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	inv, err := nvmlnode.Discover(context.Background(), nvmlnode.WithNVML(sim.NVML()), nvmlnode.WithDevRoot(dir), nvmlnode.WithProcRoot(dir), nvmlnode.WithSysRoot(dir))
	if err != nil {
		t.Fatal(err)
	}
	return sim, inv
}

func counterValues(cs map[string]resourceapi.Counter) map[string]int64 {
	out := map[string]int64{}
	for k, c := range cs {
		out[k] = c.Value.Value()
	}
	return out
}

// TestPartitionSlice: a GPU partitioned by dynamic MIG is published as
// its counter set (memory slices, compute slices, the one "+me" instance)
// and every placement of every profile plus the GPU whole, each consuming
// what it takes; a GPU with a user's MIG device keeps it as it is, loses
// the slices it covers, and is not published whole. Without DynamicMIG
// neither GPU is partitioned.
func TestPartitionSlice(t *testing.T) {
	sim, inv := dynInventory(t)
	opts := dra.SliceOptions{DynamicMIG: []string{sim.UUID(0), sim.UUID(1)}}
	devs := dra.Devices(inv, inv.Devices, opts)
	byName := map[string]resourceapi.Device{}
	var gpu0, gpu1 []string
	for _, d := range devs {
		byName[d.Name] = d
		switch {
		case strings.HasPrefix(d.Name, "mig-0-") || d.Name == "gpu-0":
			gpu0 = append(gpu0, d.Name)
		case strings.HasPrefix(d.Name, "mig-1-") || d.Name == "gpu-1":
			gpu1 = append(gpu1, d.Name)
		}
	}
	// H100 80GB: 7 + 7 (+me) + 4 + 3 + 2 + 1 + 1 placements, and the GPU.
	if len(gpu0) != 26 || !slices.Contains(gpu0, "gpu-0") || !slices.Contains(gpu0, "mig-0-1g-10gb-3") || !slices.Contains(gpu0, "mig-0-1g-10gb-me-6") {
		t.Fatalf("GPU 0 published %d devices: %v", len(gpu0), gpu0)
	}
	for _, name := range gpu0 {
		d := byName[name]
		if len(d.ConsumesCounters) != 1 || d.ConsumesCounters[0].CounterSet != "gpu-0" {
			t.Fatalf("%s consumes %+v", name, d.ConsumesCounters)
		}
	}
	p := byName["mig-0-2g-20gb-2"]
	want := map[string]int64{"memory-slice-2": 1, "memory-slice-3": 1, "compute-slices": 2}
	if got := counterValues(p.ConsumesCounters[0].Counters); !mapsEqual(got, want) {
		t.Errorf("2g.20gb at 2 consumes %v, want %v", got, want)
	}
	if a := p.Attributes; *a["profile"].StringValue != "2g.20gb" || *a["type"].StringValue != "mig" || *a["placementStart"].IntValue != 2 || *a["parentUUID"].StringValue != sim.UUID(0) || a["uuid"].StringValue != nil {
		t.Errorf("2g.20gb at 2: attributes %v", a)
	}
	if got := counterValues(byName["mig-0-1g-10gb-me-0"].ConsumesCounters[0].Counters); got["profile-20"] != 1 {
		t.Errorf("1g.10gb+me consumes %v", got)
	}
	whole := counterValues(byName["gpu-0"].ConsumesCounters[0].Counters)
	if len(whole) != 10 || whole["compute-slices"] != 7 || whole["memory-slice-7"] != 1 {
		t.Errorf("the whole GPU consumes %v", whole)
	}
	// GPU 1: its user's 3g.40gb (GI 1) as it is; of the placements only
	// those in slices 4-7 (3 + 3 + 2 + 1 + 1).
	user := sim.MIGDevices(1)[0]
	if len(gpu1) != 11 || slices.Contains(gpu1, "gpu-1") || !slices.Contains(gpu1, "mig-1-1-0") || slices.Contains(gpu1, "mig-1-1g-10gb-3") || !slices.Contains(gpu1, "mig-1-3g-40gb-4") {
		t.Fatalf("GPU 1 published %v", gpu1)
	}
	if d := byName["mig-1-1-0"]; len(d.ConsumesCounters) != 0 || *d.Attributes["uuid"].StringValue != user.UUID {
		t.Errorf("the user's MIG device: %+v", d)
	}
	sets := dra.CounterSets(inv.Devices, opts)
	if len(sets) != 2 || sets[0].Name != "gpu-0" || sets[1].Name != "gpu-1" {
		t.Fatalf("counter sets %+v", sets)
	}
	if got := counterValues(sets[0].Counters); !mapsEqual(got, whole) {
		t.Errorf("GPU 0's counters %v, want what the whole GPU consumes, %v", got, whole)
	}
	want = map[string]int64{"memory-slice-4": 1, "memory-slice-5": 1, "memory-slice-6": 1, "memory-slice-7": 1, "compute-slices": 4, "profile-20": 1}
	if got := counterValues(sets[1].Counters); !mapsEqual(got, want) {
		t.Errorf("GPU 1's counters %v, want %v", got, want)
	}
	slicesOf := dra.PoolSlices(devs, sets)
	if len(slicesOf) != 2 || len(slicesOf[0].Devices) != len(devs) || len(slicesOf[1].SharedCounters) != 2 || slicesOf[1].Devices != nil {
		t.Errorf("pool slices: %d", len(slicesOf))
	}

	plain := dra.Devices(inv, inv.Devices, dra.SliceOptions{})
	if slices.ContainsFunc(plain, func(d resourceapi.Device) bool { return len(d.ConsumesCounters) > 0 || d.Name == "gpu-0" }) || len(plain) != 7 {
		t.Errorf("without dynamic MIG: %d devices", len(plain))
	}
	if len(dra.CounterSets(inv.Devices, dra.SliceOptions{})) != 0 {
		t.Error("counter sets without dynamic MIG")
	}
}

func mapsEqual(a, b map[string]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestPoolSlices: devices in slices of at most 128, 64 where one consumes
// counters or has taints; counter sets apart, 8 a slice.
func TestPoolSlices(t *testing.T) {
	devs := func(n int, counters bool) []resourceapi.Device {
		out := make([]resourceapi.Device, n)
		for i := range out {
			out[i].Name = "d" + string(rune('a'+i%26))
		}
		if counters && n > 0 {
			out[n-1].ConsumesCounters = []resourceapi.DeviceCounterConsumption{{CounterSet: "s"}}
		}
		return out
	}
	sets := func(n int) []resourceapi.CounterSet { return make([]resourceapi.CounterSet, n) }
	tests := []struct {
		name     string
		devs     []resourceapi.Device
		sets     []resourceapi.CounterSet
		devSizes []int
		setSizes []int
	}{
		{"none", nil, nil, []int{0}, []int{0}},
		{"130 plain", devs(130, false), nil, []int{128, 2}, []int{0, 0}},
		{"70 with counters", devs(70, true), sets(9), []int{64, 6, 0, 0}, []int{0, 0, 8, 1}},
		{"tainted", append(devs(65, false), resourceapi.Device{Taints: []resourceapi.DeviceTaint{{Key: "k", Effect: resourceapi.DeviceTaintEffectNoSchedule}}}), nil, []int{64, 2}, []int{0, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := dra.PoolSlices(tt.devs, tt.sets)
			var ds, ss []int
			for _, s := range got {
				ds, ss = append(ds, len(s.Devices)), append(ss, len(s.SharedCounters))
			}
			if !slices.Equal(ds, tt.devSizes) || !slices.Equal(ss, tt.setSizes) {
				t.Errorf("devices %v counter sets %v, want %v %v", ds, ss, tt.devSizes, tt.setSizes)
			}
		})
	}
}

// TestDynamicMIGPrepare: a claim for a 1g.10gb placement of a GPU with no
// instance gets one made at that placement, held, recorded in its
// checkpoint and in its CDI spec (the parent's node, the instance's
// capability nodes); the GPU cannot be prepared whole meanwhile, and the
// made device is not published as a MIG device of its own; Unprepare
// destroys it, after which the whole GPU can be prepared. The user's
// MIG device on GPU 1 is never touched.
func TestDynamicMIGPrepare(t *testing.T) {
	ctx := context.Background()
	e := newDynEnv(t)
	d, a := e.driver(t)
	user := e.sim.MIGDevices(1)
	devs, err := d.Prepare(ctx, claim("mig", "mig-0-1g-10gb-3"))
	if err != nil {
		t.Fatal(err)
	}
	made := e.sim.MIGDevices(0)
	if len(made) != 1 || made[0].Start != 3 || made[0].Profile != "1g.10gb" {
		t.Fatalf("GPU 0 holds %+v", made)
	}
	e.checkPrepared(t, d, a, "mig", devs, []string{made[0].UUID})
	cp, err := dra.ReadCheckpoint(e.stateDir, "mig")
	if err != nil {
		t.Fatal(err)
	}
	if pd := cp.Devices[0]; pd.UUID != made[0].UUID || pd.MIG == nil || *pd.MIG != (dra.PreparedMIG{Parent: e.sim.UUID(0), Profile: "1g.10gb", Start: 3, Size: 1, GI: made[0].GI, CI: made[0].CI}) {
		t.Fatalf("checkpoint records %+v %+v", cp.Devices[0], cp.Devices[0].MIG)
	}
	_, spec := e.specOf(t, d, "mig")
	gi := e.host.DevRoot + "/nvidia-caps/nvidia-cap"
	if !strings.Contains(string(spec), e.host.DevRoot+"/nvidia0") || strings.Count(string(spec), gi) < 2 || strings.Contains(string(spec), e.host.DevRoot+"/nvidia1\"") {
		t.Errorf("CDI spec of the made device:\n%s", spec)
	}
	for _, s := range d.Resources("n").Pools["n"].Slices {
		for _, dev := range s.Devices {
			if strings.HasPrefix(dev.Name, "mig-0-") && len(dev.ConsumesCounters) == 0 {
				t.Errorf("the made device is published as %s", dev.Name)
			}
		}
	}
	if _, err := d.Prepare(ctx, claim("whole", "gpu-0")); !errors.Is(err, allocator.ErrDeviceUnavailable) {
		t.Fatalf("the whole GPU while its MIG device exists: %v", err)
	}
	e.checkGone(t, d, a, "whole")
	if _, err := d.Prepare(ctx, claim("two", "mig-0-1g-10gb-5", "gpu-2")); !errors.Is(err, dra.ErrMIGClaim) {
		t.Fatalf("a dynamic MIG device beside a GPU: %v", err)
	}
	// A configuration whose MIG profiles leave the placement's out.
	head := `"apiVersion":"gpu.gpuiso.io/v1","kind":"GPUConfig"`
	if _, err := d.Prepare(ctx, withConfig(claim("cfg", "mig-0-2g-20gb-4"), nil, `{`+head+`,"mig":{"profiles":["1g.10gb"]}}`)); !errors.Is(err, dra.ErrInvalidDeviceConfig) {
		t.Fatalf("a 2g.20gb placement against a configuration of 1g.10gb: %v", err)
	}
	e.checkGone(t, d, a, "cfg")
	if n := len(e.sim.MIGDevices(0)); n != 1 {
		t.Fatalf("GPU 0 holds %d MIG devices after a refused configuration", n)
	}
	if err := d.Unprepare(ctx, "mig"); err != nil {
		t.Fatal(err)
	}
	e.checkGone(t, d, a, "mig")
	if n := len(e.sim.MIGDevices(0)); n != 0 {
		t.Fatalf("GPU 0 holds %d MIG devices after the unprepare", n)
	}
	devs, err = d.Prepare(ctx, claim("whole", "gpu-0"))
	if err != nil {
		t.Fatal(err)
	}
	e.checkPrepared(t, d, a, "whole", devs, []string{e.sim.UUID(0)})
	if _, err := d.Prepare(ctx, claim("mig2", "mig-0-7g-80gb-0")); !errors.Is(err, allocator.ErrDeviceUnavailable) || len(e.sim.MIGDevices(0)) != 0 {
		t.Fatalf("a MIG device while the GPU is prepared whole: %v", err)
	}
	if err := d.Unprepare(ctx, "whole"); err != nil {
		t.Fatal(err)
	}
	if got := e.sim.MIGDevices(1); !slices.Equal(got, user) {
		t.Errorf("the user's MIG devices changed: %+v, were %+v", got, user)
	}
}

// TestDynamicMIGRestore: a restart keeps the MIG device of a prepared
// claim (held again, not published as a device of its own) and destroys
// the ones no claim explains: one made by a preparation cut short, one of
// an owner whose checkpoint is gone. The user's stays.
func TestDynamicMIGRestore(t *testing.T) {
	ctx := context.Background()
	e := newDynEnv(t)
	d, a := e.driver(t)
	if _, err := d.Prepare(ctx, claim("kept", "mig-0-3g-40gb-4")); err != nil {
		t.Fatal(err)
	}
	// A preparation cut short after its device was made: the checkpoint
	// says started.
	if _, err := a.AllocateMIGAt(ctx, "claim-cut", allocator.MIGAt{Parent: e.sim.UUID(0), Profile: "1g.10gb", Start: 0}); err != nil {
		t.Fatal(err)
	}
	cut := dra.Checkpoint{UID: "cut", State: dra.StatePrepareStarted, Owner: "claim-cut", Devices: []dra.PreparedDevice{{
		Requests: []string{"r0"}, Pool: "n", Device: "mig-0-1g-10gb-0", MIG: &dra.PreparedMIG{Parent: e.sim.UUID(0), Profile: "1g.10gb", Start: 0, Size: 1},
	}}}
	if err := dra.WriteCheckpoint(e.stateDir, cut); err != nil {
		t.Fatal(err)
	}
	// An owner of no claim.
	if _, err := a.AllocateMIGAt(ctx, "claim-gone", allocator.MIGAt{Parent: e.sim.UUID(1), Profile: "1g.10gb", Start: 5}); err != nil {
		t.Fatal(err)
	}
	if len(e.sim.MIGDevices(0)) != 2 || len(e.sim.MIGDevices(1)) != 2 {
		t.Fatalf("before the restart: %v, %v", e.sim.MIGDevices(0), e.sim.MIGDevices(1))
	}
	a.Close()

	d, a = e.driver(t)
	kept := e.sim.MIGDevices(0)
	if len(kept) != 1 || kept[0].Profile != "3g.40gb" || kept[0].Start != 4 {
		t.Fatalf("GPU 0 after the restart: %+v", kept)
	}
	if got := e.sim.MIGDevices(1); len(got) != 1 || got[0].Profile != "3g.40gb" || got[0].Start != 0 {
		t.Fatalf("GPU 1 after the restart: %+v", got)
	}
	if _, err := os.Stat(filepath.Join(e.stateDir, "cut.json")); !os.IsNotExist(err) {
		t.Errorf("the cut-short claim's checkpoint: %v", err)
	}
	if al, err := a.Allocation("claim-kept"); err != nil || len(al.Devices) != 1 || al.Devices[0].UUID != kept[0].UUID {
		t.Fatalf("the kept claim's hold: %+v, %v", al, err)
	}
	for _, s := range d.Resources("n").Pools["n"].Slices {
		for _, dev := range s.Devices {
			if dev.Name == dra.MIGDeviceName(node.MIGDevice{Parent: 0, GI: kept[0].GI, CI: kept[0].CI}) {
				t.Errorf("the kept claim's device is published as %s after the restart", dev.Name)
			}
		}
	}
	if err := d.Unprepare(ctx, "kept"); err != nil {
		t.Fatal(err)
	}
	if n := len(e.sim.MIGDevices(0)); n != 0 {
		t.Fatalf("GPU 0 holds %d after the kept claim's unprepare", n)
	}
}

// TestPartitionSliceHealth: an unhealthy partitioned GPU's devices carry
// the health taint with a taint key, and are left out without one.
func TestPartitionSliceHealth(t *testing.T) {
	sim, inv := dynInventory(t)
	devs := slices.Clone(inv.Devices)
	devs[0].Health = node.Unhealthy("xid 79")
	opts := dra.SliceOptions{DynamicMIG: []string{sim.UUID(0), sim.UUID(1)}}
	for _, d := range dra.Devices(inv, devs, opts) {
		if strings.HasPrefix(d.Name, "mig-0-") || d.Name == "gpu-0" {
			t.Fatalf("without a taint key the unhealthy GPU publishes %s", d.Name)
		}
	}
	opts.TaintKey = dra.TaintKey(dra.DefaultDriverName)
	n := 0
	for _, d := range dra.Devices(inv, devs, opts) {
		switch {
		case strings.HasPrefix(d.Name, "mig-0-") || d.Name == "gpu-0":
			n++
			if len(d.Taints) != 1 || d.Taints[0].Effect != resourceapi.DeviceTaintEffectNoExecute {
				t.Errorf("%s: taints %+v", d.Name, d.Taints)
			}
		case strings.HasPrefix(d.Name, "mig-1-") && len(d.Taints) != 0:
			t.Errorf("%s of a healthy GPU: taints %+v", d.Name, d.Taints)
		}
	}
	if n != 26 {
		t.Errorf("the unhealthy GPU publishes %d devices with taints, want 26", n)
	}
}

// TestDynamicMIGUserInstanceAfter: once the driver's MIG device is
// destroyed, a MIG device a user makes on the GPU is the user's: published
// as it is, the placements it covers and the GPU whole no longer.
func TestDynamicMIGUserInstanceAfter(t *testing.T) {
	ctx := context.Background()
	e := newDynEnv(t)
	d, _ := e.driver(t)
	if _, err := d.Prepare(ctx, claim("mig", "mig-0-1g-10gb-3")); err != nil {
		t.Fatal(err)
	}
	if err := d.Unprepare(ctx, "mig"); err != nil {
		t.Fatal(err)
	}
	names := func() []string {
		var out []string
		for _, s := range d.Resources("n").Pools["n"].Slices {
			for _, dev := range s.Devices {
				out = append(out, dev.Name)
			}
		}
		return out
	}
	if got := names(); !slices.Contains(got, "gpu-0") || !slices.Contains(got, "mig-0-1g-10gb-3") {
		t.Fatalf("after the unprepare: %v", got)
	}
	user, err := e.sim.MIGManager(e.host).CreateMIGAt(ctx, e.sim.UUID(0), "1g.10gb", 3)
	if err != nil {
		t.Fatal(err)
	}
	// The driver's allocator learns of it when it is discovered again.
	d, _ = e.driver(t)
	got := names()
	if !slices.Contains(got, dra.MIGDeviceName(user)) || slices.Contains(got, "gpu-0") || slices.Contains(got, "mig-0-1g-10gb-3") || slices.Contains(got, "mig-0-7g-80gb-0") {
		t.Fatalf("with a user's 1g.10gb at 3: %v", got)
	}
}

// TestDynamicMIGNeedsPlacer: a driver told to partition GPUs by dynamic
// MIG with an allocator that cannot make MIG devices is refused at New,
// not claim by claim at Prepare.
func TestDynamicMIGNeedsPlacer(t *testing.T) {
	e := newDynEnv(t)
	a, err := allocator.New(e.inv, allocator.WithStateDir(e.allocDir))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if a.PlacesMIG() {
		t.Fatal("an allocator without a MIG manager places MIG devices")
	}
	_, err = dra.New(e.inv, a, dra.Config{CDIDir: e.cdiDir, StateDir: e.stateDir, Slice: dra.SliceOptions{DynamicMIG: []string{e.sim.UUID(0)}}})
	if !errors.Is(err, dra.ErrNoMIGManager) || !errors.Is(err, dra.ErrInvalidConfig) {
		t.Fatalf("New with dynamic MIG and no MIG placer = %v, want ErrNoMIGManager and ErrInvalidConfig", err)
	}
	if _, err := os.Stat(e.stateDir); !os.IsNotExist(err) {
		t.Errorf("the refused driver made its state directory: %v", err)
	}
}

// killedAfterCreate is the node's MIG manager with the plugin killed the
// moment NVML has made a device: the preparing goroutine ends there
// (runtime.Goexit runs only the deferred unlocks), before the allocator
// or the checkpoint records the device, as a crash would leave them.
type killedAfterCreate struct{ *simnode.MIGManager }

func (k killedAfterCreate) CreateMIGAt(ctx context.Context, parent, profile string, start int) (node.MIGDevice, error) {
	dev, err := k.MIGManager.CreateMIGAt(ctx, parent, profile, start)
	if err == nil {
		runtime.Goexit()
	}
	return dev, err
}

// placementsDestroyed records DestroyMIGAt's calls; it finds no instance
// (the simulated driver keeps no GPU instance without its compute
// instance).
type placementsDestroyed struct{ calls []string }

func (p *placementsDestroyed) DestroyMIGAt(_ context.Context, parent string, start int) error {
	p.calls = append(p.calls, fmt.Sprintf("%s@%d", parent, start))
	return fmt.Errorf("no GPU instance at %d: %w", start, node.ErrNotFound)
}

// TestDynamicMIGKilledBeforeRecord: a plugin killed after NVML made a
// claim's MIG device and before anything recorded it leaves the device on
// the GPU and the claim's checkpoint started with the placement alone; the
// next start destroys the device (nobody else holds it, and the placement
// is the claim's), publishes the placement again, and the claim's next
// Prepare makes its device anew instead of finding it in the way. A
// placement with no MIG device left is handed to Config.MIGDestroyer, for
// a GPU instance made without its compute instance.
func TestDynamicMIGKilledBeforeRecord(t *testing.T) {
	ctx := context.Background()
	e := newDynEnv(t)
	d, a := e.driverWith(t, func(m *simnode.MIGManager) allocator.MIGManager { return killedAfterCreate{m} }, nil)
	done := make(chan struct{})
	go func() {
		defer close(done)
		d.Prepare(ctx, claim("killed", "mig-0-1g-10gb-3"))
		t.Error("Prepare returned past the kill")
	}()
	<-done
	a.Close()
	if made := e.sim.MIGDevices(0); len(made) != 1 || made[0].Start != 3 {
		t.Fatalf("GPU 0 after the kill holds %+v, want the device made at 3", made)
	}
	cp, err := dra.ReadCheckpoint(e.stateDir, "killed")
	if err != nil || cp.State != dra.StatePrepareStarted || cp.Devices[0].MIG == nil || cp.Devices[0].UUID != "" {
		t.Fatalf("the killed claim's checkpoint: %+v, %v", cp, err)
	}

	destroyer := &placementsDestroyed{}
	d, a = e.driverWith(t, func(m *simnode.MIGManager) allocator.MIGManager { return m }, destroyer)
	if made := e.sim.MIGDevices(0); len(made) != 0 {
		t.Fatalf("GPU 0 after the restart holds %+v, want nothing", made)
	}
	if len(destroyer.calls) != 0 {
		t.Errorf("DestroyMIGAt called for %v although the device was found", destroyer.calls)
	}
	e.checkGone(t, d, a, "killed")
	published := false
	for _, s := range d.Resources("n").Pools["n"].Slices {
		for _, dev := range s.Devices {
			published = published || dev.Name == "mig-0-1g-10gb-3"
		}
	}
	if !published {
		t.Error("the killed claim's placement is not published after the restart")
	}
	devs, err := d.Prepare(ctx, claim("killed", "mig-0-1g-10gb-3"))
	if err != nil {
		t.Fatalf("the killed claim prepared again: %v", err)
	}
	made := e.sim.MIGDevices(0)
	if len(made) != 1 {
		t.Fatalf("GPU 0 holds %+v", made)
	}
	e.checkPrepared(t, d, a, "killed", devs, []string{made[0].UUID})
	if err := d.Unprepare(ctx, "killed"); err != nil {
		t.Fatal(err)
	}

	// Killed after the GPU instance and before its compute instance:
	// no MIG device at the placement, which goes to the destroyer.
	a.Close()
	cut := dra.Checkpoint{UID: "gi", State: dra.StatePrepareStarted, Owner: "claim-gi", Devices: []dra.PreparedDevice{{
		Requests: []string{"r0"}, Pool: "n", Device: "mig-0-2g-20gb-4", MIG: &dra.PreparedMIG{Parent: e.sim.UUID(0), Profile: "2g.20gb", Start: 4, Size: 2},
	}}}
	if err := dra.WriteCheckpoint(e.stateDir, cut); err != nil {
		t.Fatal(err)
	}
	d, a = e.driverWith(t, func(m *simnode.MIGManager) allocator.MIGManager { return m }, destroyer)
	if want := []string{e.sim.UUID(0) + "@4"}; !slices.Equal(destroyer.calls, want) {
		t.Errorf("DestroyMIGAt calls %v, want %v", destroyer.calls, want)
	}
	e.checkGone(t, d, a, "gi")
}
