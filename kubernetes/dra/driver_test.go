package dra_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/isolator/cdi"
	"github.com/gpuiso/gpuiso/kubernetes/dra"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/simnode"
)

type env struct {
	sim      *simnode.Node
	inv      *node.Inventory
	stateDir string
	allocDir string
	cdiDir   string
}

// newEnv builds a simulated node with its host tree (root: the plans need
// device nodes) and empty state and CDI directories.
func newEnv(t *testing.T, name string) *env {
	t.Helper()
	sim, _, inv := testenv.SimulatedNode(t, name)
	dir := t.TempDir()
	return &env{sim: sim, inv: inv, stateDir: filepath.Join(dir, "claims"), allocDir: filepath.Join(dir, "alloc"), cdiDir: filepath.Join(dir, "cdi")}
}

// driver starts a driver as a (re)started plugin would: a new allocator on
// the same state.
func (e *env) driver(t *testing.T) (*dra.Driver, *allocator.Allocator) {
	t.Helper()
	for _, d := range []string{e.allocDir, e.cdiDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	a, err := allocator.New(e.inv, allocator.WithStateDir(e.allocDir))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	d, err := dra.New(e.inv, a, dra.Config{CDIDir: e.cdiDir, StateDir: e.stateDir})
	if err != nil {
		t.Fatal(err)
	}
	return d, a
}

func claim(uid string, devices ...string) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid), Namespace: "ns", Name: "claim-" + uid}}
	if devices == nil {
		return c
	}
	c.Status.Allocation = &resourceapi.AllocationResult{}
	for i, d := range devices {
		driver, dev, ok := strings.Cut(d, "|")
		if !ok {
			driver, dev = dra.DefaultDriverName, d
		}
		c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results, resourceapi.DeviceRequestAllocationResult{
			Request: "r" + string(rune('0'+i)), Driver: driver, Pool: "node-1", Device: dev,
		})
	}
	return c
}

func firstMIG(inv *node.Inventory, profile string) node.MIGDevice {
	for _, d := range inv.Devices {
		for _, m := range d.MIGDevices {
			if m.Profile == profile {
				return m
			}
		}
	}
	return node.MIGDevice{}
}

// prepared checks what a prepared claim leaves: its CDI spec, valid and
// holding its GPUs' nodes, its checkpoint, and the allocator's hold.
func (e *env) checkPrepared(t *testing.T, d *dra.Driver, a *allocator.Allocator, uid string, devs []kubeletplugin.Device, uuids []string) {
	t.Helper()
	owner := "claim-" + uid
	path, err := cdi.Writer{Dir: e.cdiDir}.AllocationPath(d.CDIKind(), owner)
	if err != nil {
		t.Fatal(err)
	}
	spec, err := cdi.ValidateFile(path)
	if err != nil {
		t.Fatalf("claim's CDI spec: %v", err)
	}
	if len(spec.Devices) != 1 {
		t.Fatalf("spec devices %v", spec.Devices)
	}
	var env string
	for _, kv := range spec.Devices[0].ContainerEdits.Env {
		if v, ok := strings.CutPrefix(kv, "NVIDIA_VISIBLE_DEVICES="); ok {
			env = v
		}
	}
	if got := strings.Split(env, ","); !sameSet(got, uuids) {
		t.Errorf("NVIDIA_VISIBLE_DEVICES=%q, want %v", env, uuids)
	}
	if len(devs) == 0 || !slices.Equal(devs[0].CDIDeviceIDs, []string{d.CDIKind() + "=" + cdi.AllocationDevice(owner)}) {
		t.Errorf("CDI ids %+v", devs)
	}
	if _, err := os.Stat(filepath.Join(e.stateDir, uid+".json")); err != nil {
		t.Errorf("checkpoint: %v", err)
	}
	al, err := a.Allocation(owner)
	if err != nil {
		t.Fatalf("allocator: %v", err)
	}
	var held []string
	for _, r := range al.Devices {
		held = append(held, r.UUID)
	}
	if !sameSet(held, uuids) {
		t.Errorf("allocator holds %v, want %v", held, uuids)
	}
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// checkGone checks that nothing of claim uid is left.
func (e *env) checkGone(t *testing.T, d *dra.Driver, a *allocator.Allocator, uid string) {
	t.Helper()
	path, _ := cdi.Writer{Dir: e.cdiDir}.AllocationPath(d.CDIKind(), "claim-"+uid)
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("CDI spec left: %v", err)
	}
	if _, err := os.Stat(filepath.Join(e.stateDir, uid+".json")); !os.IsNotExist(err) {
		t.Errorf("checkpoint left: %v", err)
	}
	if al, err := a.Allocation("claim-" + uid); err == nil {
		t.Errorf("allocator still holds %v", al.Devices)
	}
}

// TestPrepare: claims of whole GPUs and MIG devices get a CDI spec, a
// checkpoint and the allocator's hold; bad claims leave nothing.
func TestPrepare(t *testing.T) {
	tests := []struct {
		name    string
		sim     string
		devices func(inv *node.Inventory) (names, uuids []string)
		wantErr error
	}{
		{name: "one GPU", sim: "dgx1-volta", devices: func(inv *node.Inventory) ([]string, []string) {
			return []string{"gpu-3"}, []string{inv.Devices[3].UUID}
		}},
		{name: "two GPUs", sim: "dgx1-volta", devices: func(inv *node.Inventory) ([]string, []string) {
			return []string{"gpu-0", "gpu-1"}, []string{inv.Devices[0].UUID, inv.Devices[1].UUID}
		}},
		{name: "a MIG device", sim: "hgx-h100-mig", devices: func(inv *node.Inventory) ([]string, []string) {
			m := firstMIG(inv, "1g.10gb")
			return []string{dra.MIGDeviceName(m)}, []string{m.UUID}
		}},
		{name: "another driver's device only", sim: "dgx1-volta", devices: func(*node.Inventory) ([]string, []string) {
			return []string{"other.example.com|gpu-0"}, nil
		}},
		{name: "unknown device", sim: "dgx1-volta", wantErr: dra.ErrUnknownDevice, devices: func(*node.Inventory) ([]string, []string) {
			return []string{"gpu-0", "gpu-99"}, nil
		}},
		{name: "not allocated", sim: "dgx1-volta", wantErr: dra.ErrNotAllocated, devices: func(*node.Inventory) ([]string, []string) {
			return nil, nil
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, tt.sim)
			d, a := e.driver(t)
			names, uuids := tt.devices(e.inv)
			res, err := d.PrepareResourceClaims(t.Context(), []*resourceapi.ResourceClaim{claim("u1", names...)})
			if err != nil {
				t.Fatal(err)
			}
			r := res["u1"]
			if tt.wantErr != nil {
				if !errors.Is(r.Err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", r.Err, tt.wantErr)
				}
				e.checkGone(t, d, a, "u1")
				return
			}
			if r.Err != nil {
				t.Fatal(r.Err)
			}
			if uuids == nil {
				if len(r.Devices) != 0 {
					t.Errorf("devices %v for a claim of another driver", r.Devices)
				}
				e.checkGone(t, d, a, "u1")
				return
			}
			if len(r.Devices) != len(names) {
				t.Fatalf("devices %+v", r.Devices)
			}
			for i, dev := range r.Devices {
				if dev.DeviceName != names[i] || dev.PoolName != "node-1" || len(dev.Requests) != 1 {
					t.Errorf("device %d: %+v", i, dev)
				}
			}
			e.checkPrepared(t, d, a, "u1", r.Devices, uuids)

			// Preparing again answers the same and holds nothing more.
			again, err := d.Prepare(t.Context(), claim("u1", names...))
			if err != nil || !slices.EqualFunc(again, r.Devices, func(x, y kubeletplugin.Device) bool {
				return x.DeviceName == y.DeviceName && slices.Equal(x.CDIDeviceIDs, y.CDIDeviceIDs)
			}) {
				t.Errorf("prepare again = %+v, %v", again, err)
			}

			// Unprepare removes everything, and again is no error.
			for range 2 {
				ures, err := d.UnprepareResourceClaims(t.Context(), []kubeletplugin.NamespacedObject{{UID: "u1"}})
				if err != nil || ures["u1"] != nil {
					t.Fatalf("unprepare = %v, %v", ures, err)
				}
			}
			e.checkGone(t, d, a, "u1")
		})
	}
}

// TestRestart: a restarted plugin (new driver, new allocator on the same
// state) keeps every prepared claim, answers a repeated prepare the same,
// unprepares them, and refuses a device another claim holds.
func TestRestart(t *testing.T) {
	e := newEnv(t, "dgx1-volta")
	d1, a1 := e.driver(t)
	first, err := d1.Prepare(t.Context(), claim("keep", "gpu-0", "gpu-1"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d1.Prepare(t.Context(), claim("other", "gpu-2")); err != nil {
		t.Fatal(err)
	}
	a1.Close()

	d2, a2 := e.driver(t)
	if got, err := d2.Prepared(); err != nil || !slices.Equal(got, []string{"keep", "other"}) {
		t.Fatalf("prepared after the restart: %v, %v", got, err)
	}
	e.checkPrepared(t, d2, a2, "keep", first, []string{e.inv.Devices[0].UUID, e.inv.Devices[1].UUID})
	again, err := d2.Prepare(t.Context(), claim("keep", "gpu-0", "gpu-1"))
	if err != nil || len(again) != 2 || !slices.Equal(again[0].CDIDeviceIDs, first[0].CDIDeviceIDs) {
		t.Errorf("prepare after the restart = %+v, %v", again, err)
	}
	// A claim for a GPU another claim holds is refused and leaves nothing.
	if _, err := d2.Prepare(t.Context(), claim("thief", "gpu-1")); !errors.Is(err, node.ErrInsufficient) && !errors.Is(err, node.ErrUnavailable) && !errors.Is(err, node.ErrExists) {
		t.Errorf("prepare of a held GPU: %v", err)
	}
	e.checkGone(t, d2, a2, "thief")
	for _, uid := range []string{"keep", "other"} {
		if err := d2.Unprepare(t.Context(), uid); err != nil {
			t.Fatal(err)
		}
		e.checkGone(t, d2, a2, uid)
	}
}

// TestCutShortPreparation: a claim whose preparation was cut short (a
// started checkpoint, the allocator's hold taken) is rolled back and
// prepared afresh; unprepared, it leaves nothing.
func TestCutShortPreparation(t *testing.T) {
	e := newEnv(t, "dgx1-volta")
	d, a := e.driver(t)
	uuid := e.inv.Devices[4].UUID
	if _, err := a.Allocate(t.Context(), "claim-cut", allocator.Request{Devices: []string{uuid}}); err != nil {
		t.Fatal(err)
	}
	if err := dra.WriteCheckpoint(e.stateDir, dra.Checkpoint{UID: "cut", State: dra.StatePrepareStarted, Owner: "claim-cut",
		Devices: []dra.PreparedDevice{{Requests: []string{"r0"}, Pool: "node-1", Device: "gpu-4", UUID: uuid}}}); err != nil {
		t.Fatal(err)
	}
	devs, err := d.Prepare(t.Context(), claim("cut", "gpu-4"))
	if err != nil {
		t.Fatal(err)
	}
	e.checkPrepared(t, d, a, "cut", devs, []string{uuid})

	// Cut short again, then unprepared: the kubelet gave up on the pod.
	if err := dra.WriteCheckpoint(e.stateDir, dra.Checkpoint{UID: "cut", State: dra.StatePrepareStarted, Owner: "claim-cut",
		Devices: []dra.PreparedDevice{{Requests: []string{"r0"}, Pool: "node-1", Device: "gpu-4", UUID: uuid}}}); err != nil {
		t.Fatal(err)
	}
	if err := d.Unprepare(t.Context(), "cut"); err != nil {
		t.Fatal(err)
	}
	e.checkGone(t, d, a, "cut")
}

// TestCorruptCheckpoint: a checkpoint that fails its checks is reported
// (ErrCorruptCheckpoint) and left as it is, never silently reset.
func TestCorruptCheckpoint(t *testing.T) {
	tests := []struct {
		name    string
		content string
	}{
		{name: "not JSON", content: "{"},
		{name: "foreign", content: `{"format":"other","version":1,"uid":"bad","state":"PrepareCompleted"}`},
		{name: "checksum", content: `{"format":"gpuiso-dra-claim","version":1,"uid":"bad","state":"PrepareCompleted","owner":"claim-bad","devices":[],"checksum":"00"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, "dgx1-volta")
			d, _ := e.driver(t)
			path := filepath.Join(e.stateDir, "bad.json")
			if err := os.WriteFile(path, []byte(tt.content), 0o600); err != nil {
				t.Fatal(err)
			}
			if _, err := d.Prepare(t.Context(), claim("bad", "gpu-0")); !errors.Is(err, dra.ErrCorruptCheckpoint) {
				t.Errorf("prepare: %v", err)
			}
			if err := d.Unprepare(t.Context(), "bad"); !errors.Is(err, dra.ErrCorruptCheckpoint) {
				t.Errorf("unprepare: %v", err)
			}
			if b, _ := os.ReadFile(path); string(b) != tt.content {
				t.Error("checkpoint changed")
			}
		})
	}
}
