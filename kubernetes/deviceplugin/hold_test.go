package deviceplugin_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/kubernetes/deviceplugin"
	"github.com/gpuiso/gpuiso/node"
)

// podResources is the kubelet's pod-resources service: the device ids its
// pods hold, by resource.
type podResources struct {
	podresourcesapi.UnimplementedPodResourcesListerServer
	mu   sync.Mutex
	devs map[string][]string
}

func (f *podResources) List(context.Context, *podresourcesapi.ListPodResourcesRequest) (*podresourcesapi.ListPodResourcesResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := &podresourcesapi.ContainerResources{Name: "main"}
	for res, ids := range f.devs {
		c.Devices = append(c.Devices, &podresourcesapi.ContainerDevices{ResourceName: res, DeviceIds: slices.Clone(ids)})
	}
	return &podresourcesapi.ListPodResourcesResponse{PodResources: []*podresourcesapi.PodResources{{Name: "p", Namespace: "default", Containers: []*podresourcesapi.ContainerResources{c}}}}, nil
}

func (f *podResources) set(devs map[string][]string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.devs = devs
}

// servePodResources serves a podResources on a socket in dir, until t
// ends.
func servePodResources(t *testing.T, dir string) (*podResources, string) {
	t.Helper()
	pr := &podResources{}
	sock := filepath.Join(dir, "pod-resources.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	podresourcesapi.RegisterPodResourcesListerServer(srv, pr)
	go srv.Serve(l)
	t.Cleanup(srv.Stop)
	return pr, sock
}

// holding is a DGX-1's device plugin manager over an allocator (GPU 7
// served as two time slices), with a fake pod-resources service; the
// manager is not Run: Container, Adopt and Reconcile need no kubelet
// registration.
func holding(t *testing.T, grace time.Duration) (*setup, *podResources) {
	return holdingOn(t, "dgx1-volta", []int{7}, grace)
}

// holdingOn is holding on the simulated node profile, the GPUs of shared
// served as two time slices each.
func holdingOn(t *testing.T, profile string, shared []int, grace time.Duration) (*setup, *podResources) {
	t.Helper()
	s := &setup{}
	s.sim, _, s.inv = testenv.SimulatedNode(t, profile)
	var uuids []string
	for _, i := range shared {
		uuids = append(uuids, s.inv.Devices[i].UUID)
	}
	var err error
	if s.alloc, err = allocator.New(s.inv, allocator.WithShared(uuids...), allocator.WithTimeSlices(2)); err != nil {
		t.Fatal(err)
	}
	if s.dir, err = os.MkdirTemp("", "dp"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(s.dir) })
	pr, sock := servePodResources(t, s.dir)
	cfg := deviceplugin.Config{Dir: s.dir, Shared: uuids, Replicas: 2, PodResources: sock, TimeSliceGrace: grace}
	if s.mgr, err = deviceplugin.New(s.inv, s.alloc, cfg); err != nil {
		t.Fatal(err)
	}
	return s, pr
}

// plugin is the manager's plugin of resource.
func (s *setup) plugin(t *testing.T, resource string) *deviceplugin.Plugin {
	t.Helper()
	for _, p := range s.mgr.Plugins() {
		if p.Resource() == resource {
			return p
		}
	}
	t.Fatalf("no plugin of %s", resource)
	return nil
}

func owners(t *testing.T, a *allocator.Allocator, uuid string) []string {
	t.Helper()
	o, err := a.Owners(uuid)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// TestAllocateHoldsDevices: a whole GPU the device plugin hands out is
// held in the allocator for its DeviceOwner, so a DRA claim on the same
// allocator cannot take it while the pod runs; handing it out again is
// idempotent; a GPU a claim holds is refused with ErrHeld, and a container
// refused for one of its GPUs leaves the others free.
func TestAllocateHoldsDevices(t *testing.T) {
	s, _ := holding(t, time.Minute)
	ctx := t.Context()
	gpus := s.plugin(t, "nvidia.com/gpu")
	u := func(i int) string { return s.inv.Devices[i].UUID }
	ref := func(i int) []node.DeviceRef { return []node.DeviceRef{s.inv.Devices[i].Ref()} }

	if _, err := gpus.Container([]string{u(0)}); err != nil {
		t.Fatal(err)
	}
	if got := owners(t, s.alloc, u(0)); !slices.Equal(got, []string{deviceplugin.DeviceOwner(u(0))}) {
		t.Fatalf("GPU 0 held by %v, want the device plugin's owner", got)
	}
	if _, err := s.alloc.Claim(ctx, "claim-a", ref(0)); !errors.Is(err, allocator.ErrDeviceUnavailable) {
		t.Fatalf("a claim of the device plugin's GPU: %v, want ErrDeviceUnavailable", err)
	}
	if _, err := gpus.Container([]string{u(0)}); err != nil {
		t.Fatalf("the same GPU handed out again (its pod ended): %v", err)
	}

	if _, err := s.alloc.Claim(ctx, "claim-b", ref(1)); err != nil {
		t.Fatal(err)
	}
	_, err := gpus.Container([]string{u(2), u(1)})
	if !errors.Is(err, deviceplugin.ErrHeld) {
		t.Fatalf("a GPU a claim holds: %v, want ErrHeld", err)
	}
	if got := owners(t, s.alloc, u(2)); len(got) != 0 {
		t.Errorf("GPU 2 of the refused container is held by %v", got)
	}
	if got := owners(t, s.alloc, u(1)); !slices.Equal(got, []string{"claim-b"}) {
		t.Errorf("GPU 1 is held by %v, want the claim alone", got)
	}
}

// TestReconcileDevices: a GPU held for a pod of the device plugin goes
// back to the allocator once the kubelet lists no pod with it (after the
// grace of a GPU just handed out), and stays held while one does; a
// claim's allocation is never touched.
func TestReconcileDevices(t *testing.T) {
	s, pr := holding(t, time.Millisecond)
	ctx := t.Context()
	u0, u1 := s.inv.Devices[0].UUID, s.inv.Devices[1].UUID
	gpus := s.plugin(t, "nvidia.com/gpu")
	for _, id := range []string{u0, u1} {
		if _, err := gpus.Container([]string{id}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.alloc.Claim(ctx, "claim-c", []node.DeviceRef{s.inv.Devices[2].Ref()}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	pr.set(map[string][]string{"nvidia.com/gpu": {u1}})
	released, err := s.mgr.Reconcile(ctx)
	if err != nil || !slices.Equal(released, []string{deviceplugin.DeviceOwner(u0)}) {
		t.Fatalf("Reconcile = %v, %v, want GPU 0's owner alone", released, err)
	}
	if got := owners(t, s.alloc, u1); !slices.Equal(got, []string{deviceplugin.DeviceOwner(u1)}) {
		t.Errorf("GPU 1, which a pod holds, is held by %v", got)
	}
	if _, err := s.alloc.Claim(ctx, "claim-d", []node.DeviceRef{s.inv.Devices[0].Ref()}); err != nil {
		t.Errorf("GPU 0 after Reconcile: %v", err)
	}
	if got := owners(t, s.alloc, s.inv.Devices[2].UUID); !slices.Equal(got, []string{"claim-c"}) {
		t.Errorf("the claim's GPU is held by %v", got)
	}
}

// TestAdopt: a manager that starts holds what the kubelet's pods hold of
// its resources (a GPU and a time slice handed out before it ran, by an
// earlier version or a device plugin since turned off), so that no claim
// takes them; a GPU a claim took meanwhile is reported and the others are
// held all the same; Reconcile gives them back once their pods end.
func TestAdopt(t *testing.T) {
	s, pr := holding(t, time.Millisecond)
	ctx := t.Context()
	u := func(i int) string { return s.inv.Devices[i].UUID }
	if _, err := s.alloc.Claim(ctx, "claim-e", []node.DeviceRef{s.inv.Devices[4].Ref()}); err != nil {
		t.Fatal(err)
	}
	pr.set(map[string][]string{
		"nvidia.com/gpu":        {u(3), u(4), "GPU-not-of-this-node"},
		"nvidia.com/gpu.shared": {deviceplugin.TimeSliceID(u(7), 1)},
		"example.com/other":     {u(5)},
	})
	held, err := s.mgr.Adopt(ctx)
	want := []string{deviceplugin.DeviceOwner(u(3)), deviceplugin.TimeSliceOwner(u(7), 1)}
	if !slices.Equal(held, want) {
		t.Fatalf("Adopt held %v, want %v", held, want)
	}
	if err == nil || !strings.Contains(err.Error(), u(4)) {
		t.Errorf("Adopt's error %v does not name the GPU a claim holds", err)
	}
	if _, err := s.alloc.Claim(ctx, "claim-f", []node.DeviceRef{s.inv.Devices[3].Ref()}); !errors.Is(err, allocator.ErrDeviceUnavailable) {
		t.Errorf("a claim of the adopted GPU: %v, want ErrDeviceUnavailable", err)
	}
	if got := owners(t, s.alloc, u(5)); len(got) != 0 {
		t.Errorf("a GPU of another resource is held by %v", got)
	}
	if again, err := s.mgr.Adopt(ctx); !slices.Equal(again, want) || err == nil {
		t.Errorf("Adopt again = %v, %v", again, err)
	}
	pr.set(nil)
	released, err := s.mgr.Reconcile(ctx)
	if err != nil || !slices.Equal(released, want) {
		t.Fatalf("Reconcile after the pods ended = %v, %v, want %v", released, err, want)
	}
}

// TestAdoptWithoutKubelet: a manager that cannot ask the kubelet holds
// nothing and says why.
func TestAdoptWithoutKubelet(t *testing.T) {
	s, _ := holding(t, time.Minute)
	m, err := deviceplugin.New(s.inv, s.alloc, deviceplugin.Config{Dir: s.dir, PodResources: filepath.Join(s.dir, "none.sock")})
	if err != nil {
		t.Fatal(err)
	}
	if held, err := m.Adopt(t.Context()); len(held) != 0 || !errors.Is(err, node.ErrUnavailable) {
		t.Errorf("Adopt without a kubelet = %v, %v, want nothing and ErrUnavailable", held, err)
	}
	if al := s.alloc.Allocations(); len(al) != 0 {
		t.Errorf("held without a kubelet: %+v", al)
	}
}

// TestAllocateHoldsMIGDevices: a MIG device the device plugin hands out is
// held for its DeviceOwner as a whole GPU is, and given back once no pod
// holds it.
func TestAllocateHoldsMIGDevices(t *testing.T) {
	s, pr := holdingOn(t, "hgx-h100-mig", nil, time.Millisecond)
	var mig node.MIGDevice
	for _, d := range s.inv.Devices {
		for _, m := range d.MIGDevices {
			if m.Profile == "1g.10gb" && mig.UUID == "" {
				mig = m
			}
		}
	}
	if mig.UUID == "" {
		t.Fatal("no 1g.10gb MIG device")
	}
	if _, err := s.plugin(t, "nvidia.com/mig-1g.10gb").Container([]string{mig.UUID}); err != nil {
		t.Fatal(err)
	}
	if got := owners(t, s.alloc, mig.UUID); !slices.Equal(got, []string{deviceplugin.DeviceOwner(mig.UUID)}) {
		t.Fatalf("the MIG device is held by %v", got)
	}
	time.Sleep(5 * time.Millisecond)
	pr.set(nil)
	if released, err := s.mgr.Reconcile(t.Context()); err != nil || !slices.Equal(released, []string{deviceplugin.DeviceOwner(mig.UUID)}) {
		t.Fatalf("Reconcile = %v, %v", released, err)
	}
}

// TestHeldChanged: Config.HeldChanged is called as soon as what the
// plugin holds changes (a container's GPU or time slice held, devices
// given back by Reconcile, devices of running pods adopted), so that a
// DRA driver on the same allocator taints a held device at once; a
// refused container and a Reconcile that gives nothing back do not call
// it.
func TestHeldChanged(t *testing.T) {
	s, pr := holding(t, time.Millisecond)
	calls := 0
	cfg := deviceplugin.Config{Dir: s.dir, Shared: []string{s.inv.Devices[7].UUID}, Replicas: 2,
		PodResources: filepath.Join(s.dir, "pod-resources.sock"), TimeSliceGrace: time.Millisecond, HeldChanged: func() { calls++ }}
	mgr, err := deviceplugin.New(s.inv, s.alloc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.mgr = mgr
	ctx := t.Context()
	u := func(i int) string { return s.inv.Devices[i].UUID }
	step := func(what string, want int) {
		t.Helper()
		if calls != want {
			t.Fatalf("%s: HeldChanged called %d times in all, want %d", what, calls, want)
		}
	}
	if _, err := s.plugin(t, "nvidia.com/gpu").Container([]string{u(0)}); err != nil {
		t.Fatal(err)
	}
	step("a GPU handed out", 1)
	if _, err := s.alloc.Claim(ctx, "claim-a", []node.DeviceRef{s.inv.Devices[1].Ref()}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.plugin(t, "nvidia.com/gpu").Container([]string{u(1)}); !errors.Is(err, deviceplugin.ErrHeld) {
		t.Fatalf("a claim's GPU: %v, want ErrHeld", err)
	}
	step("a container refused", 1)
	ts := s.plugin(t, deviceplugin.DefaultSharedResourceName).Devices()
	if _, err := s.plugin(t, deviceplugin.DefaultSharedResourceName).Container([]string{ts[0].ID}); err != nil {
		t.Fatal(err)
	}
	step("a time slice handed out", 2)

	time.Sleep(5 * time.Millisecond) // past the grace of what was just handed out
	pr.set(map[string][]string{"nvidia.com/gpu": {u(0)}, deviceplugin.DefaultSharedResourceName: {ts[0].ID}})
	if released, err := s.mgr.Reconcile(ctx); err != nil || len(released) != 0 {
		t.Fatalf("Reconcile with every pod running = %v, %v", released, err)
	}
	step("a Reconcile that gives nothing back", 2)
	pr.set(nil)
	if released, err := s.mgr.Reconcile(ctx); err != nil || len(released) != 2 {
		t.Fatalf("Reconcile after the pods = %v, %v, want two owners", released, err)
	}
	step("a Reconcile that gives back", 3)

	pr.set(map[string][]string{"nvidia.com/gpu": {u(2)}})
	if held, err := s.mgr.Adopt(ctx); err != nil || len(held) != 1 {
		t.Fatalf("Adopt = %v, %v", held, err)
	}
	step("Adopt", 4)
}
