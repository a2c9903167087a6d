package dra_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/utils/ptr"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/isolator/cdi"
	"github.com/gpuiso/gpuiso/isolator/mps"
	"github.com/gpuiso/gpuiso/kubernetes/dra"
	"github.com/gpuiso/gpuiso/node"
)

const gib = 1 << 30

// shareEnv is a simulated DGX-1 whose GPU 0 is shared, with an MPS
// daemon directory of its own; every daemon left in it is stopped when the
// test ends.
type shareEnv struct {
	*env
	mpsDir string
}

func newShareEnv(t *testing.T) *shareEnv {
	t.Helper()
	testenv.RequireSimulatedMPS(t)
	e := &shareEnv{env: newEnv(t, "dgx1-volta")}
	e.mpsDir = filepath.Join(filepath.Dir(e.stateDir), "mps")
	t.Cleanup(func() {
		m, err := mps.New(e.mpsDir)
		if err != nil {
			return
		}
		defer m.Close()
		m.Sweep(context.Background(), nil)
	})
	return e
}

func (e *shareEnv) gpu() node.Device { return e.inv.Devices[0] }

// driver starts a driver as a (re)started plugin would: a new allocator
// and MPS manager on the same state.
func (e *shareEnv) driver(t *testing.T) (*dra.Driver, *allocator.Allocator, *mps.Manager) {
	t.Helper()
	for _, d := range []string{e.allocDir, e.cdiDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	a, err := allocator.New(e.inv, allocator.WithStateDir(e.allocDir), allocator.WithShared(e.gpu().UUID))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	m, err := mps.New(e.mpsDir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	d, err := dra.New(e.inv, a, dra.Config{CDIDir: e.cdiDir, StateDir: e.stateDir, MPS: m,
		Slice: dra.SliceOptions{Shared: []string{e.gpu().UUID}}})
	if err != nil {
		t.Fatal(err)
	}
	return d, a, m
}

// shareClaim is claim uid allocated a share of device with memory bytes,
// as the scheduler writes it: a share id and the consumed capacity. Each
// config is the parameters of an opaque configuration of the driver.
func shareClaim(uid, device string, memory int64, config ...string) *resourceapi.ResourceClaim {
	c := claim(uid, device)
	r := &c.Status.Allocation.Devices.Results[0]
	r.ShareID = ptr.To(types.UID("5ba7e0c1-0000-4000-8000-" + strings.Repeat("0", 12-len(uid)) + uid))
	r.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{"memory": *resource.NewQuantity(memory, resource.BinarySI)}
	for i, p := range config {
		src := resourceapi.AllocationConfigSourceClass
		if i > 0 {
			src = resourceapi.AllocationConfigSourceClaim
		}
		c.Status.Allocation.Devices.Config = append(c.Status.Allocation.Devices.Config, resourceapi.DeviceAllocationConfiguration{
			Source: src, DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
				Driver: dra.DefaultDriverName, Parameters: runtime.RawExtension{Raw: []byte(p)},
			}},
		})
	}
	return c
}

// daemons are the owners of the running daemons of the directory.
func (e *shareEnv) daemons(t *testing.T) map[string]mps.Daemon {
	t.Helper()
	ds, err := mps.Daemons(t.Context(), e.mpsDir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]mps.Daemon{}
	for _, d := range ds {
		out[d.Owner] = d
	}
	return out
}

// checkShare checks a prepared share: its CDI spec gives its GPU alone,
// its daemon's pipe directory at /tmp/nvidia-mps and its /dev/shm, the
// pipe directory named to CUDA and the memory limit; its daemon runs for
// that GPU with the limits; the allocator holds the share; the result
// carries the share id.
func (e *shareEnv) checkShare(t *testing.T, d *dra.Driver, a *allocator.Allocator, m *mps.Manager, c *resourceapi.ResourceClaim, devs []kubeletplugin.Device, memory uint64, compute int) {
	t.Helper()
	uid := string(c.UID)
	owner := "claim-" + uid
	e.checkPrepared(t, d, a, uid, devs, []string{e.gpu().UUID})
	if want := c.Status.Allocation.Devices.Results[0].ShareID; len(devs) != 1 || devs[0].ShareID == nil || *devs[0].ShareID != *want {
		t.Errorf("result %+v, want the share id %s", devs, *want)
	}
	dm, ok := e.daemons(t)[owner]
	if !ok || !dm.Alive {
		t.Fatalf("no running daemon for %s: %+v", owner, e.daemons(t))
	}
	if dm.GPU != e.gpu().UUID || dm.Limits.MemoryBytes != memory || dm.Limits.ComputePercent != compute {
		t.Errorf("daemon %+v, want gpu %s, %d bytes, %d%%", dm, e.gpu().UUID, memory, compute)
	}
	held, err := m.Held(t.Context(), owner)
	if err != nil {
		t.Fatal(err)
	}
	if want := float64(compute); compute == 0 && held.ComputePercent != 100 || compute > 0 && held.ComputePercent != want ||
		!held.MemorySet || held.MemoryMinMiB > memory>>20 || memory>>20 > held.MemoryMaxMiB {
		t.Errorf("the daemon holds %+v, want %d MiB, %d%%", held, memory>>20, compute)
	}
	path, _ := cdi.Writer{Dir: e.cdiDir}.AllocationPath(d.CDIKind(), owner)
	spec, err := cdi.ValidateFile(path)
	if err != nil {
		t.Fatal(err)
	}
	edits := spec.Devices[0].ContainerEdits
	mounts := map[string]string{}
	for _, mt := range edits.Mounts {
		mounts[mt.ContainerPath] = mt.HostPath
	}
	if mounts["/tmp/nvidia-mps"] != dm.PipeDir || mounts["/dev/shm"] != dm.ShmDir || len(mounts) != 2 {
		t.Errorf("mounts %v, want the daemon's pipe %s and shm %s", mounts, dm.PipeDir, dm.ShmDir)
	}
	env := map[string]string{}
	for _, kv := range edits.Env {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	if env["CUDA_MPS_PIPE_DIRECTORY"] != "/tmp/nvidia-mps" || env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "" || env["CUDA_VISIBLE_DEVICES"] != e.gpu().UUID {
		t.Errorf("env %v", env)
	}
	if compute > 0 && env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "" {
		t.Errorf("no compute limit in env %v", env)
	}
	al, err := a.Allocation(owner)
	if err != nil || al.Share == nil || al.Share.MemoryBytes != memory || al.Share.ComputePercent != compute {
		t.Errorf("allocator holds %+v, %v", al, err)
	}
}

// TestPrepareShares: the seed's scenario on the driver. A 16 GiB GPU is
// shared: two claims of 8 GiB get a share each, with a daemon of its own
// holding its limit; a third does not fit (the scheduler would not have
// allocated it: the allocator refuses it all the same, saying how much is
// free) and leaves nothing; once one
// share is unprepared, its daemon is gone and the third is prepared.
// Unpreparing the rest leaves no daemon, share or file.
func TestPrepareShares(t *testing.T) {
	e := newShareEnv(t)
	d, a, m := e.driver(t)
	if got := e.gpu().MemoryBytes; got != 16*gib {
		t.Fatalf("the simulated V100 has %d bytes, want 16 GiB", got)
	}
	share := dra.ShareDeviceName(e.gpu())
	c1, c2, c3 := shareClaim("s1", share, 8*gib), shareClaim("s2", share, 8*gib), shareClaim("s3", share, 8*gib)
	res, err := d.PrepareResourceClaims(t.Context(), []*resourceapi.ResourceClaim{c1, c2, c3})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []*resourceapi.ResourceClaim{c1, c2} {
		if err := res[c.UID].Err; err != nil {
			t.Fatalf("%s: %v", c.UID, err)
		}
		e.checkShare(t, d, a, m, c, res[c.UID].Devices, 8*gib, 0)
	}
	if err := res["s3"].Err; !errors.Is(err, allocator.ErrDeviceUnavailable) || !strings.Contains(err.Error(), "0 B free") {
		t.Fatalf("a third 8 GiB share: %v, want the GPU unavailable with 0 B free", err)
	}
	e.checkGone(t, d, a, "s3")
	if _, ok := e.daemons(t)["claim-s3"]; ok {
		t.Error("the share that did not fit has a daemon")
	}
	if shares, _ := a.Shares(e.gpu().UUID); len(shares) != 2 {
		t.Errorf("the GPU holds %d shares, want 2", len(shares))
	}

	pipe := e.daemons(t)["claim-s1"].Dir
	if err := d.Unprepare(t.Context(), "s1"); err != nil {
		t.Fatal(err)
	}
	e.checkGone(t, d, a, "s1")
	if _, err := os.Stat(pipe); !os.IsNotExist(err) {
		t.Errorf("the unprepared share's daemon directory is left: %v", err)
	}
	devs, err := d.Prepare(t.Context(), c3)
	if err != nil {
		t.Fatal(err)
	}
	e.checkShare(t, d, a, m, c3, devs, 8*gib, 0)

	// Preparing again answers the same, with the same daemon.
	before := e.daemons(t)["claim-s3"]
	again, err := d.Prepare(t.Context(), c3)
	if err != nil || len(again) != 1 || *again[0].ShareID != *devs[0].ShareID {
		t.Errorf("prepare again = %+v, %v", again, err)
	}
	if after := e.daemons(t)["claim-s3"]; after.Pid != before.Pid {
		t.Errorf("preparing again changed the daemon: %d, was %d", after.Pid, before.Pid)
	}

	for _, uid := range []string{"s2", "s3"} {
		if err := d.Unprepare(t.Context(), uid); err != nil {
			t.Fatal(err)
		}
		e.checkGone(t, d, a, uid)
	}
	if left := e.daemons(t); len(left) > 0 {
		t.Errorf("daemons left: %v", left)
	}
	if shares, _ := a.Shares(e.gpu().UUID); len(shares) != 0 {
		t.Errorf("shares left: %v", shares)
	}
}

// TestPrepareShareConfig: the compute percentage of a share comes from the
// driver's opaque configurations that apply to its request, the claim's
// over the class's; bad ones and malformed allocations are refused and
// leave nothing.
func TestPrepareShareConfig(t *testing.T) {
	e := newShareEnv(t)
	d, a, m := e.driver(t)
	share := dra.ShareDeviceName(e.gpu())
	t.Run("class", func(t *testing.T) {
		c := shareClaim("c1", share, 2*gib, `{"kind":"ShareConfig","computePercent":40}`)
		devs, err := d.Prepare(t.Context(), c)
		if err != nil {
			t.Fatal(err)
		}
		e.checkShare(t, d, a, m, c, devs, 2*gib, 40)
		if err := d.Unprepare(t.Context(), "c1"); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("claim over class", func(t *testing.T) {
		c := shareClaim("c2", share, 1*gib+256<<20, `{"computePercent":40}`, `{"apiVersion":"gpu.gpuiso.io/v1","computePercent":25}`)
		devs, err := d.Prepare(t.Context(), c)
		if err != nil {
			t.Fatal(err)
		}
		e.checkShare(t, d, a, m, c, devs, 1*gib+256<<20, 25)
		if err := d.Unprepare(t.Context(), "c2"); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("another request's", func(t *testing.T) {
		c := shareClaim("c3", share, 2*gib, `{"computePercent":40}`)
		c.Status.Allocation.Devices.Config[0].Requests = []string{"other"}
		devs, err := d.Prepare(t.Context(), c)
		if err != nil {
			t.Fatal(err)
		}
		e.checkShare(t, d, a, m, c, devs, 2*gib, 0)
		if err := d.Unprepare(t.Context(), "c3"); err != nil {
			t.Fatal(err)
		}
	})
	bad := []struct {
		name  string
		claim func() *resourceapi.ResourceClaim
		want  error
	}{
		{"unknown field", func() *resourceapi.ResourceClaim { return shareClaim("b1", share, 2*gib, `{"memoryPercent":50}`) }, dra.ErrInvalidShare},
		{"other kind", func() *resourceapi.ResourceClaim { return shareClaim("b2", share, 2*gib, `{"kind":"GpuConfig"}`) }, dra.ErrInvalidShare},
		{"compute over 100", func() *resourceapi.ResourceClaim { return shareClaim("b3", share, 2*gib, `{"computePercent":101}`) }, dra.ErrInvalidShare},
		{"no share id", func() *resourceapi.ResourceClaim {
			c := shareClaim("b4", share, 2*gib)
			c.Status.Allocation.Devices.Results[0].ShareID = nil
			return c
		}, dra.ErrInvalidShare},
		{"no consumed memory", func() *resourceapi.ResourceClaim {
			c := shareClaim("b5", share, 2*gib)
			c.Status.Allocation.Devices.Results[0].ConsumedCapacity = nil
			return c
		}, dra.ErrInvalidShare},
		{"beside a whole GPU", func() *resourceapi.ResourceClaim {
			c := shareClaim("b6", share, 2*gib)
			c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results, claim("x", "gpu-3").Status.Allocation.Devices.Results...)
			return c
		}, dra.ErrShareClaim},
		{"more than the GPU", func() *resourceapi.ResourceClaim { return shareClaim("b7", share, 17*gib) }, allocator.ErrDeviceUnavailable},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			c := tt.claim()
			_, err := d.Prepare(t.Context(), c)
			if !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
			e.checkGone(t, d, a, string(c.UID))
			if len(e.daemons(t)) > 0 {
				t.Errorf("daemons left: %v", e.daemons(t))
			}
		})
	}
}

// TestNewShared: shared GPUs need an MPS manager and must be whole GPUs of
// the node.
func TestNewShared(t *testing.T) {
	_, inv := inventory(t, "dgx1-volta")
	a, err := allocator.New(inv)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	for name, cfg := range map[string]dra.Config{
		"no MPS":      {StateDir: t.TempDir(), Slice: dra.SliceOptions{Shared: []string{inv.Devices[0].UUID}}},
		"unknown GPU": {StateDir: t.TempDir(), MPS: &mps.Manager{}, Slice: dra.SliceOptions{Shared: []string{"GPU-nope"}}},
	} {
		if _, err := dra.New(inv, a, cfg); !errors.Is(err, dra.ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}
}

// TestRestoreShares: the kubelet plugin killed (SIGKILL) and started
// again. A prepared share's running daemon is kept as it is; one killed
// with the plugin is started again in its directories, its CDI spec
// unchanged; a daemon no checkpoint explains is stopped; a share cut short
// (PrepareStarted, its daemon running) is rolled back by its next
// Prepare, daemon included.
func TestRestoreShares(t *testing.T) {
	e := newShareEnv(t)
	d, _, _ := e.driver(t)
	share := dra.ShareDeviceName(e.gpu())
	kept, killed := shareClaim("k1", share, 4*gib), shareClaim("k2", share, 4*gib)
	for _, c := range []*resourceapi.ResourceClaim{kept, killed} {
		if _, err := d.Prepare(t.Context(), c); err != nil {
			t.Fatal(err)
		}
	}
	_, spec := e.specOf(t, d, "k2")
	before := e.daemons(t)
	// What a crash leaves: a daemon of a claim that has no checkpoint
	// (started by a Prepare whose checkpoint is gone), and a share cut
	// short with its daemon running.
	m0, err := mps.New(e.mpsDir)
	if err != nil {
		t.Fatal(err)
	}
	defer m0.Close()
	if _, err := m0.Start(t.Context(), "claim-stray", e.gpu().Ref(), mps.Limits{MemoryBytes: gib}); err != nil {
		t.Fatal(err)
	}
	cut := dra.Checkpoint{UID: "cut", State: dra.StatePrepareStarted, Owner: "claim-cut",
		Devices: []dra.PreparedDevice{{Requests: []string{"r0"}, Pool: "node-1", Device: share, UUID: e.gpu().UUID, ShareID: "5ba7e0c1-0000-4000-8000-000000000cut"}},
		Share:   &dra.PreparedShare{MemoryBytes: 4 * gib}}
	if err := dra.WriteCheckpoint(e.stateDir, cut); err != nil {
		t.Fatal(err)
	}
	if _, err := m0.Start(t.Context(), "claim-cut", e.gpu().Ref(), mps.Limits{MemoryBytes: 4 * gib}); err != nil {
		t.Fatal(err)
	}
	if err := linux.Kill(before["claim-k2"].Pid); err != nil {
		t.Fatal(err)
	}
	until(t, func() bool { return !e.daemons(t)["claim-k2"].Alive })
	e.reboot(t) // the CDI specs go too, as after a node's reboot

	d2, a2, m2 := e.driver(t)
	written, err := d2.Restore(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(written, []string{"k1", "k2"}) {
		t.Errorf("restore wrote %v, want k1 k2", written)
	}
	after := e.daemons(t)
	if _, ok := after["claim-stray"]; ok {
		t.Error("the daemon of no claim was kept")
	}
	if a, b := after["claim-k1"], before["claim-k1"]; !a.Alive || a.Pid != b.Pid {
		t.Errorf("the running daemon was not kept: %+v, was %+v", a, b)
	}
	if a, b := after["claim-k2"], before["claim-k2"]; !a.Alive || a.Pid == b.Pid || a.PipeDir != b.PipeDir {
		t.Errorf("the killed daemon was not started again in place: %+v, was %+v", a, b)
	}
	if _, got := e.specOf(t, d2, "k2"); string(got) != string(spec) {
		t.Errorf("the restored spec differs:\n%s\nwas:\n%s", got, spec)
	}
	e.checkShare(t, d2, a2, m2, killed, kept2(t, d2, killed), 4*gib, 0)
	if !after["claim-cut"].Alive {
		t.Fatal("the cut-short share's daemon is gone before its claim is rolled back")
	}
	cutDir := after["claim-cut"].Dir

	// The cut-short claim's next Prepare rolls it back and prepares it
	// anew: a new daemon.
	c := shareClaim("cut", share, 4*gib)
	devs, err := d2.Prepare(t.Context(), c)
	if err != nil {
		t.Fatal(err)
	}
	if now := e.daemons(t)["claim-cut"]; now.Pid == after["claim-cut"].Pid || now.Dir != cutDir {
		t.Errorf("the cut-short share's daemon %+v, was %+v", now, after["claim-cut"])
	}
	e.checkShare(t, d2, a2, m2, c, devs, 4*gib, 0)
	for _, uid := range []string{"k1", "k2", "cut"} {
		if err := d2.Unprepare(t.Context(), uid); err != nil {
			t.Fatal(err)
		}
		e.checkGone(t, d2, a2, uid)
	}
	if left := e.daemons(t); len(left) > 0 {
		t.Errorf("daemons left: %v", left)
	}
	for _, dm := range after {
		if s := mps.Strays("/proc", dm.Mark); len(s) > 0 {
			t.Errorf("MPS processes of %s left: %v", dm.Owner, s)
		}
	}
}

// kept2 is what Prepare answers for an already prepared claim.
func kept2(t *testing.T, d *dra.Driver, c *resourceapi.ResourceClaim) []kubeletplugin.Device {
	t.Helper()
	devs, err := d.Prepare(t.Context(), c)
	if err != nil {
		t.Fatal(err)
	}
	return devs
}

// until polls cond; the test's deadline bounds it.
func until(t *testing.T, cond func() bool) {
	t.Helper()
	for !cond() {
		if t.Context().Err() != nil {
			t.Fatal("gave up waiting")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
