package deviceplugin_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/isolator/mps"
	"github.com/gpuiso/gpuiso/kubernetes/deviceplugin"
	"github.com/gpuiso/gpuiso/node"
)

// sliceCount is how many concurrent slices each shared GPU is split in.
const sliceCount = 4

// slicedNode is a simulated DGX-1 whose GPUs 0 and 3 are shared, with
// the state of a device plugin that serves them as concurrent slices:
// the allocator's directory, the MPS daemons' directory and a fake
// pod-resources service. Every daemon left is stopped when the test ends.
type slicedNode struct {
	*setup
	pr       *podResources
	prSock   string
	allocDir string
	mpsDir   string
	shared   []string
}

func newSlicedNode(t *testing.T) *slicedNode {
	t.Helper()
	testenv.RequireSimulatedMPS(t)
	n := &slicedNode{setup: &setup{}}
	n.sim, _, n.inv = testenv.SimulatedNode(t, "dgx1-volta")
	n.shared = []string{n.inv.Devices[0].UUID, n.inv.Devices[3].UUID}
	var err error
	// Socket paths must stay under 108 bytes: a short directory.
	if n.dir, err = os.MkdirTemp("", "dp"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(n.dir) })
	n.allocDir, n.mpsDir = filepath.Join(n.dir, "allocator"), filepath.Join(n.dir, "mps")
	if err := os.Mkdir(n.allocDir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		m, err := mps.New(n.mpsDir)
		if err != nil {
			return
		}
		defer m.Close()
		m.Sweep(context.Background(), nil)
	})
	n.pr, n.prSock = servePodResources(t, n.dir)
	return n
}

// start starts a plugin on the node's state, as a (re)started program
// does: a new allocator, MPS manager and device plugin manager (not Run:
// Container, Adopt and Reconcile need no registration), with strategy.
func (n *slicedNode) start(t *testing.T, strategy deviceplugin.Strategy, grace time.Duration) (*deviceplugin.Manager, *allocator.Allocator, *mps.Manager) {
	t.Helper()
	a, err := allocator.New(n.inv, allocator.WithStateDir(n.allocDir), allocator.WithShared(n.shared...), allocator.WithTimeSlices(sliceCount))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	m, err := mps.New(n.mpsDir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	cfg := deviceplugin.Config{Dir: n.dir, Shared: n.shared, Replicas: sliceCount, PodResources: n.prSock,
		TimeSliceGrace: grace, Strategy: strategy, MPS: m}
	mgr, err := deviceplugin.New(n.inv, a, cfg)
	if err != nil {
		t.Fatal(err)
	}
	n.mgr, n.alloc = mgr, a
	return mgr, a, m
}

// daemons are the running daemons of the node's MPS directory, by owner.
func (n *slicedNode) daemons(t *testing.T) map[string]mps.Daemon {
	t.Helper()
	ds, err := mps.Daemons(t.Context(), n.mpsDir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]mps.Daemon{}
	for _, d := range ds {
		if d.Alive {
			out[d.Owner] = d
		}
	}
	return out
}

// container is the shared resource's answer for a container given ids.
func (n *slicedNode) container(t *testing.T, ids ...string) (*pluginapi.ContainerAllocateResponse, error) {
	t.Helper()
	return n.plugin(t, deviceplugin.DefaultSharedResourceName).Container(ids)
}

// sliceOwners are the owners of the concurrent slices the allocator
// holds on GPU uuid, each checked to be one of sliceCount.
func sliceOwners(t *testing.T, a *allocator.Allocator, uuid string) []string {
	t.Helper()
	shares, err := a.Shares(uuid)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, s := range shares {
		if s.Share == nil || s.Share.Mode != allocator.ShareSlice || s.Share.Slices != sliceCount {
			t.Errorf("%s holds %+v on %s, not a slice of %d", s.Owner, s.Share, uuid, sliceCount)
		}
		out = append(out, s.Owner)
	}
	slices.Sort(out)
	return out
}

// TestConcurrentSlices: with the MPS strategy the replicas of a shared GPU
// are concurrent slices: two replicas of one GPU are held as slices of
// sliceCount in the allocator and share ONE MPS daemon, whose default
// limits (as it answers them) are 1/sliceCount of the GPU's memory and
// threads; each container gets the GPU, the daemon's pipe directory and
// /dev/shm as mounts, CUDA_MPS_PIPE_DIRECTORY and the limits in its
// environment. A container asking for two replicas is refused and holds
// nothing.
func TestConcurrentSlices(t *testing.T) {
	n := newSlicedNode(t)
	_, a, m := n.start(t, deviceplugin.StrategyMPS, time.Minute)
	u0 := n.inv.Devices[0].UUID
	gpuMiB := n.inv.Devices[0].MemoryBytes >> 20

	var pipes []string
	for k := range 2 {
		cr, err := n.container(t, deviceplugin.TimeSliceID(u0, k))
		if err != nil {
			t.Fatal(err)
		}
		if len(cr.CdiDevices) != 1 || cr.CdiDevices[0].Name != "nvidia.com/gpu="+u0 || cr.Envs["NVIDIA_VISIBLE_DEVICES"] != u0 {
			t.Errorf("replica %d: %v, %v", k, cr.CdiDevices, cr.Envs)
		}
		if got := cr.Envs[isolator.EnvMPSPipeDir]; got != isolator.MPSPipeDir {
			t.Errorf("replica %d: %s=%q, want %q", k, isolator.EnvMPSPipeDir, got, isolator.MPSPipeDir)
		}
		if got, want := cr.Envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], strconv.Itoa(100/sliceCount); got != want {
			t.Errorf("replica %d: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=%q, want %q", k, got, want)
		}
		if got, want := cr.Envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], "0="+strconv.FormatUint(gpuMiB/sliceCount, 10)+"M"; got != want {
			t.Errorf("replica %d: CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=%q, want %q", k, got, want)
		}
		mounts := map[string]string{}
		for _, mt := range cr.Mounts {
			mounts[mt.ContainerPath] = mt.HostPath
			if mt.ReadOnly {
				t.Errorf("replica %d: %s read-only", k, mt.ContainerPath)
			}
		}
		ds := n.daemons(t)
		d, ok := ds[mps.SliceOwner(u0)]
		if len(ds) != 1 || !ok {
			t.Fatalf("after replica %d the daemons are %v, want one of %s", k, keys(ds), mps.SliceOwner(u0))
		}
		if mounts[isolator.MPSPipeDir] != d.PipeDir || mounts[isolator.MPSShmDir] != d.ShmDir || len(mounts) != 2 {
			t.Errorf("replica %d: mounts %v, want %s at %s and %s at %s", k, mounts, d.PipeDir, isolator.MPSPipeDir, d.ShmDir, isolator.MPSShmDir)
		}
		pipes = append(pipes, mounts[isolator.MPSPipeDir])
		if got := sliceOwners(t, a, u0); len(got) != k+1 || !slices.Contains(got, deviceplugin.ConcurrentSliceOwner(u0, k)) {
			t.Errorf("after replica %d GPU 0 holds %v", k, got)
		}
	}
	if pipes[0] != pipes[1] {
		t.Errorf("the two replicas have the pipe directories %v, want one daemon's", pipes)
	}
	d := n.daemons(t)[mps.SliceOwner(u0)]
	if d.Slices != sliceCount || d.GPU != u0 {
		t.Errorf("the daemon serves %s in %d slices, want %s in %d", d.GPU, d.Slices, u0, sliceCount)
	}
	held, err := m.Held(t.Context(), mps.SliceOwner(u0))
	if err != nil {
		t.Fatal(err)
	}
	if want := gpuMiB / sliceCount; !held.MemorySet || held.MemoryMinMiB > want || want > held.MemoryMaxMiB || held.ComputePercent != float64(100/sliceCount) {
		t.Errorf("the daemon holds %+v, want %d MiB and %d%%", held, want, 100/sliceCount)
	}

	// Two replicas in one container: refused, nothing held or started.
	u3 := n.inv.Devices[3].UUID
	if _, err := n.container(t, deviceplugin.TimeSliceID(u3, 0), deviceplugin.TimeSliceID(u3, 1)); !errors.Is(err, deviceplugin.ErrSliceCount) {
		t.Errorf("two replicas in one container: %v, want ErrSliceCount", err)
	}
	if got := sliceOwners(t, a, u3); len(got) != 0 {
		t.Errorf("GPU 3 holds %v after the refused container", got)
	}
	if _, ok := n.daemons(t)[mps.SliceOwner(u3)]; ok {
		t.Error("the refused container started a daemon")
	}
	// The sliced GPU goes to no claim whole.
	if _, err := a.Allocate(t.Context(), "claim-x", allocator.Request{Devices: []string{u0}}); !errors.Is(err, allocator.ErrDeviceUnavailable) {
		t.Errorf("a claim of the sliced GPU: %v", err)
	}
}

// TestReconcileConcurrentSlices: a replica no pod holds any more is given
// back and leaves its GPU's daemon, which keeps running (the same
// process) while another replica of the GPU is held; the last one's
// release stops it.
func TestReconcileConcurrentSlices(t *testing.T) {
	n := newSlicedNode(t)
	mgr, a, _ := n.start(t, deviceplugin.StrategyMPS, time.Nanosecond)
	u0 := n.inv.Devices[0].UUID
	id0, id1 := deviceplugin.TimeSliceID(u0, 0), deviceplugin.TimeSliceID(u0, 1)
	for _, id := range []string{id0, id1} {
		if _, err := n.container(t, id); err != nil {
			t.Fatal(err)
		}
	}
	before, ok := n.daemons(t)[mps.SliceOwner(u0)]
	if !ok {
		t.Fatal("no daemon for GPU 0's slices")
	}
	n.pr.set(map[string][]string{deviceplugin.DefaultSharedResourceName: {id1}})
	released, err := mgr.Reconcile(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{deviceplugin.ConcurrentSliceOwner(u0, 0)}; !slices.Equal(released, want) {
		t.Errorf("released %v, want %v", released, want)
	}
	if got := sliceOwners(t, a, u0); !slices.Equal(got, []string{deviceplugin.ConcurrentSliceOwner(u0, 1)}) {
		t.Errorf("GPU 0 holds %v", got)
	}
	after, ok := n.daemons(t)[mps.SliceOwner(u0)]
	if !ok || after.Pid != before.Pid || after.Start != before.Start {
		t.Fatalf("with a replica held the daemon is %+v (alive %v), want pid %d still", after, ok, before.Pid)
	}
	n.pr.set(nil)
	if released, err = mgr.Reconcile(t.Context()); err != nil {
		t.Fatal(err)
	}
	if want := []string{deviceplugin.ConcurrentSliceOwner(u0, 1)}; !slices.Equal(released, want) {
		t.Errorf("released %v, want %v", released, want)
	}
	if ds := n.daemons(t); len(ds) != 0 {
		t.Errorf("after the last replica the daemons %v run", keys(ds))
	}
	if _, err := os.Stat(before.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the daemon's directory: %v, want it removed", err)
	}
	// The GPU is free for a claim again.
	if _, err := a.Allocate(t.Context(), "claim-w", allocator.Request{Devices: []string{u0}}); err != nil {
		t.Errorf("the GPU the slices left: %v", err)
	}
}

// TestAdoptConcurrentSlices: a restarted plugin (a new allocator, MPS
// manager and device plugin manager on the same state) adopts the slices
// its pods hold: their daemons keep running (the same processes); a
// daemon nothing explains (a GPU none of whose slices is held) is
// stopped.
func TestAdoptConcurrentSlices(t *testing.T) {
	n := newSlicedNode(t)
	n.start(t, deviceplugin.StrategyMPS, time.Minute)
	u0, u3, u5 := n.inv.Devices[0].UUID, n.inv.Devices[3].UUID, n.inv.Devices[5].UUID
	id0, id3 := deviceplugin.TimeSliceID(u0, 2), deviceplugin.TimeSliceID(u3, 0)
	for _, id := range []string{id0, id3} {
		if _, err := n.container(t, id); err != nil {
			t.Fatal(err)
		}
	}
	before := n.daemons(t)
	// A daemon no slice explains: a GPU's whose slices the allocator
	// does not hold.
	stray, err := mps.New(n.mpsDir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stray.StartSlice(t.Context(), deviceplugin.ConcurrentSliceOwner(u5, 0), n.inv.Devices[5].Ref(),
		allocator.Share{Mode: allocator.ShareSlice, Slices: sliceCount, MemoryBytes: n.inv.Devices[5].MemoryBytes / sliceCount}); err != nil {
		t.Fatal(err)
	}
	stray.Close()
	if len(n.daemons(t)) != 3 {
		t.Fatalf("daemons %v before the restart", keys(n.daemons(t)))
	}

	mgr, a, _ := n.start(t, deviceplugin.StrategyMPS, time.Minute)
	n.pr.set(map[string][]string{deviceplugin.DefaultSharedResourceName: {id0, id3}})
	held, err := mgr.Adopt(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{deviceplugin.ConcurrentSliceOwner(u0, 2), deviceplugin.ConcurrentSliceOwner(u3, 0)}; !slices.Equal(held, want) {
		t.Errorf("adopted %v, want %v", held, want)
	}
	after := n.daemons(t)
	if got := keys(after); !slices.Equal(got, []string{mps.SliceOwner(u0), mps.SliceOwner(u3)}) {
		t.Errorf("after the restart the daemons are %v, want GPU 0's and 3's", got)
	}
	for _, o := range []string{mps.SliceOwner(u0), mps.SliceOwner(u3)} {
		if after[o].Pid != before[o].Pid || after[o].Start != before[o].Start {
			t.Errorf("%s: pid %d after the restart, %d before", o, after[o].Pid, before[o].Pid)
		}
	}
	for _, u := range []string{u0, u3} {
		if got := sliceOwners(t, a, u); len(got) != 1 {
			t.Errorf("%s holds %v", u, got)
		}
	}
	// The slices keep their daemons: a release of one stops only its
	// GPU's.
	n.pr.set(map[string][]string{deviceplugin.DefaultSharedResourceName: {id3}})
	mgr2, _, _ := n.start(t, deviceplugin.StrategyMPS, time.Nanosecond)
	if _, err := mgr2.Reconcile(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := keys(n.daemons(t)); !slices.Equal(got, []string{mps.SliceOwner(u3)}) {
		t.Errorf("after GPU 0's slice ended the daemons are %v", got)
	}
}

// TestSliceStrategiesMix: the allocator keeps a GPU to one kind of
// share: a time-slicing plugin on the allocator of an MPS one gets no
// time slice of a GPU that has concurrent slices, and the MPS plugin no
// slice (and no daemon) of a GPU that has time slices, nor of one whose
// slices a claim holds.
func TestSliceStrategiesMix(t *testing.T) {
	n := newSlicedNode(t)
	_, a, _ := n.start(t, deviceplugin.StrategyMPS, time.Minute)
	sliced := n.plugin(t, deviceplugin.DefaultSharedResourceName)
	timed, err := deviceplugin.New(n.inv, a, deviceplugin.Config{Dir: n.dir, Shared: n.shared, Replicas: sliceCount, PodResources: n.prSock})
	if err != nil {
		t.Fatal(err)
	}
	var timeSlices *deviceplugin.Plugin
	for _, p := range timed.Plugins() {
		if p.Resource() == deviceplugin.DefaultSharedResourceName {
			timeSlices = p
		}
	}
	u0, u3 := n.inv.Devices[0].UUID, n.inv.Devices[3].UUID
	if _, err := sliced.Container([]string{deviceplugin.TimeSliceID(u0, 0)}); err != nil {
		t.Fatal(err)
	}
	if _, err := timeSlices.Container([]string{deviceplugin.TimeSliceID(u0, 1)}); !errors.Is(err, allocator.ErrDeviceUnavailable) {
		t.Errorf("a time slice of a GPU with concurrent slices: %v, want ErrDeviceUnavailable", err)
	}
	if _, err := timeSlices.Container([]string{deviceplugin.TimeSliceID(u3, 0)}); err != nil {
		t.Fatal(err)
	}
	if _, err := sliced.Container([]string{deviceplugin.TimeSliceID(u3, 1)}); !errors.Is(err, allocator.ErrDeviceUnavailable) {
		t.Errorf("a concurrent slice of a GPU with time slices: %v, want ErrDeviceUnavailable", err)
	}
	if _, ok := n.daemons(t)[mps.SliceOwner(u3)]; ok {
		t.Error("the refused slice started a daemon")
	}
	if got := sliceOwners(t, a, u0); !slices.Equal(got, []string{deviceplugin.ConcurrentSliceOwner(u0, 0)}) {
		t.Errorf("GPU 0 holds %v", got)
	}
	// A GPU whose slices of the same count a claim holds (the DRA
	// driver's, with a daemon of its own) gives no replica, and no
	// daemon is started for it.
	u5 := n.inv.Devices[5].UUID
	n.shared = append(n.shared, u5)
	_, a, _ = n.start(t, deviceplugin.StrategyMPS, time.Minute)
	if _, err := a.Allocate(t.Context(), "claim-t", allocator.Request{Devices: []string{u5}, Share: &allocator.Share{Mode: allocator.ShareSlice, Slices: sliceCount}}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.container(t, deviceplugin.TimeSliceID(u5, 0)); !errors.Is(err, deviceplugin.ErrHeld) {
		t.Errorf("a replica of a GPU a claim's slice holds: %v, want ErrHeld", err)
	}
	if got := sliceOwners(t, a, u5); !slices.Equal(got, []string{"claim-t"}) {
		t.Errorf("GPU 5 holds %v, want the claim's slice alone", got)
	}
	if _, ok := n.daemons(t)[mps.SliceOwner(u5)]; ok {
		t.Error("a daemon was started beside the claim's")
	}
	// A slice of another count (a DRA claim's, say) is refused too.
	if _, err := a.Allocate(t.Context(), "claim-s", allocator.Request{Devices: []string{u0}, Share: &allocator.Share{Mode: allocator.ShareSlice, Slices: 2}}); !errors.Is(err, allocator.ErrDeviceUnavailable) && !errors.Is(err, allocator.ErrInsufficient) {
		t.Errorf("a slice of 2 of a GPU in slices of %d: %v", sliceCount, err)
	}
}

// TestSliceStrategyConfig: the MPS strategy needs its daemons and a
// count of slices the allocator splits a GPU in; an unknown strategy is
// refused.
func TestSliceStrategyConfig(t *testing.T) {
	_, _, inv := testenv.SimulatedNode(t, "dgx1-volta")
	a, err := allocator.New(inv)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	var m noDaemons
	u := []string{inv.Devices[0].UUID}
	for name, cfg := range map[string]deviceplugin.Config{
		"no daemons":       {Shared: u, Strategy: deviceplugin.StrategyMPS, Replicas: 2},
		"one slice":        {Shared: u, Strategy: deviceplugin.StrategyMPS, Replicas: 1, MPS: m},
		"too many slices":  {Shared: u, Strategy: deviceplugin.StrategyMPS, Replicas: allocator.MaxSlices + 1, MPS: m},
		"unknown strategy": {Shared: u, Strategy: "spatial"},
	} {
		if _, err := deviceplugin.New(inv, a, cfg); !errors.Is(err, deviceplugin.ErrInvalidConfig) || !errors.Is(err, node.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}
	for name, s := range map[string]deviceplugin.Strategy{"": deviceplugin.StrategyTimeSlicing, "time-slicing": deviceplugin.StrategyTimeSlicing, "mps": deviceplugin.StrategyMPS} {
		if got, err := deviceplugin.ParseStrategy(name); err != nil || got != s {
			t.Errorf("ParseStrategy(%q) = %q, %v", name, got, err)
		}
	}
}

// noDaemons runs no daemon.
type noDaemons struct{}

func (noDaemons) StartShare(context.Context, allocator.Allocation) (*mps.Daemon, error) {
	return nil, mps.ErrNoManager
}
func (noDaemons) Stop(context.Context, string) error { return nil }
func (noDaemons) Sweep(context.Context, func(string) bool) ([]string, error) {
	return nil, nil
}
