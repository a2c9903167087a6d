package deviceplugin_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/kubernetes/deviceplugin"
	"github.com/gpuiso/gpuiso/node"
)

// startShared is start with GPUs 0 and 3 of a simulated DGX-1 served as
// three time slices each, and a fake pod-resources service.
func startShared(t *testing.T, grace time.Duration) (*setup, *podResources) {
	t.Helper()
	s := &setup{}
	s.sim, _, s.inv = testenv.SimulatedNode(t, "dgx1-volta")
	shared := []string{s.inv.Devices[0].UUID, s.inv.Devices[3].UUID}
	var err error
	if s.alloc, err = allocator.New(s.inv, allocator.WithShared(shared...), allocator.WithTimeSlices(3)); err != nil {
		t.Fatal(err)
	}
	if s.dir, err = os.MkdirTemp("", "dp"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(s.dir) })
	s.kube = startKubelet(t, s.dir)
	pr, sock := servePodResources(t, s.dir)
	cfg := deviceplugin.Config{Dir: s.dir, Shared: shared, Replicas: 3, PodResources: sock, TimeSliceGrace: grace}
	if s.mgr, err = deviceplugin.New(s.inv, s.alloc, cfg); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.mgr.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return s, pr
}

func allocate(t *testing.T, c pluginapi.DevicePluginClient, ids ...string) (*pluginapi.ContainerAllocateResponse, error) {
	t.Helper()
	resp, err := c.Allocate(t.Context(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}}})
	if err != nil {
		return nil, err
	}
	return resp.ContainerResponses[0], nil
}

// slicesOf are the owners of the time slices the allocator holds on GPU
// uuid.
func slicesOf(t *testing.T, a *allocator.Allocator, uuid string) []string {
	t.Helper()
	shares, err := a.Shares(uuid)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, s := range shares {
		if s.Share == nil || s.Share.Mode != allocator.ShareTime {
			t.Errorf("%s holds %+v on %s, not a time slice", s.Owner, s.Share, uuid)
		}
		out = append(out, s.Owner)
	}
	return out
}

// TestTimeSlices: shared GPUs are served as replicas under
// nvidia.com/gpu.shared and not whole; Allocate of a replica holds a time
// slice of its GPU in the allocator and answers with the GPU; the GPU then
// goes to no DRA claim, and a replica of a GPU a claim holds is refused;
// preferred replicas pack onto the busiest GPU.
func TestTimeSlices(t *testing.T) {
	s, _ := startShared(t, time.Minute)
	regs := s.kube.registrations(t, 2)
	if got := keys(regs); !slices.Equal(got, []string{"nvidia.com/gpu", "nvidia.com/gpu.shared"}) {
		t.Fatalf("registered %v", got)
	}
	u0, u3 := s.inv.Devices[0].UUID, s.inv.Devices[3].UUID
	listed := func(resource string) []string {
		stream, err := s.client(t, resource, regs).ListAndWatch(t.Context(), &pluginapi.Empty{})
		if err != nil {
			t.Fatal(err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, d := range resp.Devices {
			ids = append(ids, d.ID)
		}
		return ids
	}
	whole := listed("nvidia.com/gpu")
	if len(whole) != 6 || slices.Contains(whole, u0) || slices.Contains(whole, u3) {
		t.Errorf("whole GPUs %v: want the six unshared", whole)
	}
	want := []string{u0 + "::0", u0 + "::1", u0 + "::2", u3 + "::0", u3 + "::1", u3 + "::2"}
	if got := listed("nvidia.com/gpu.shared"); !slices.Equal(got, want) {
		t.Errorf("time slices %v, want %v", got, want)
	}

	c := s.client(t, "nvidia.com/gpu.shared", regs)
	for k, id := range []string{u0 + "::0", u0 + "::1"} {
		cr, err := allocate(t, c, id)
		if err != nil {
			t.Fatal(err)
		}
		if len(cr.CdiDevices) != 1 || cr.CdiDevices[0].Name != "nvidia.com/gpu="+u0 || cr.Envs["NVIDIA_VISIBLE_DEVICES"] != u0 {
			t.Errorf("replica %s: %v, %v", id, cr.CdiDevices, cr.Envs)
		}
		if got := slicesOf(t, s.alloc, u0); len(got) != k+1 || !slices.Contains(got, deviceplugin.TimeSliceOwner(u0, k)) {
			t.Errorf("after replica %s the GPU holds %v", id, got)
		}
	}
	// The same replica again (its pod ended, another got it): one slice.
	if _, err := allocate(t, c, u0+"::1"); err != nil {
		t.Fatal(err)
	}
	if got := slicesOf(t, s.alloc, u0); len(got) != 2 {
		t.Errorf("the GPU holds %v, want two time slices", got)
	}
	// The time-sliced GPU goes to no claim, whole or share.
	for _, r := range []allocator.Request{{Devices: []string{u0}}, {Devices: []string{u0}, Share: &allocator.Share{MemoryBytes: 1 << 30}}} {
		if _, err := s.alloc.Allocate(t.Context(), "claim-x", r); !errors.Is(err, allocator.ErrDeviceUnavailable) {
			t.Errorf("a claim %+v of the time-sliced GPU: %v", r, err)
		}
	}
	// A GPU a claim holds gives no replica, and nothing is left held.
	if _, err := s.alloc.Allocate(t.Context(), "claim-y", allocator.Request{Devices: []string{u3}}); err != nil {
		t.Fatal(err)
	}
	if _, err := allocate(t, c, u3+"::0"); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a replica of a GPU a claim holds: %v, want ResourceExhausted", err)
	}
	if _, err := s.alloc.Allocation(deviceplugin.TimeSliceOwner(u3, 0)); err == nil {
		t.Error("the refused replica is held")
	}
	if err := s.alloc.Release(t.Context(), "claim-y"); err != nil {
		t.Fatal(err)
	}
	// Preferred: the replica left of the busier GPU first.
	resp, err := c.GetPreferredAllocation(t.Context(), &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
		AvailableDeviceIDs: []string{u3 + "::0", u3 + "::1", u3 + "::2", u0 + "::2"}, AllocationSize: 1,
	}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.ContainerResponses[0].DeviceIDs; !slices.Equal(got, []string{u0 + "::2"}) {
		t.Errorf("preferred %v, want the last replica of GPU 0", got)
	}
}

// TestReconcileTimeSlices: time slices that no pod holds (as the kubelet's
// pod-resources service says) are given back, those in use kept; one just
// taken is kept within the grace; when the kubelet cannot be asked,
// nothing is released.
func TestReconcileTimeSlices(t *testing.T) {
	t.Run("released", func(t *testing.T) {
		s, pr := startShared(t, time.Nanosecond)
		c := s.client(t, "nvidia.com/gpu.shared", s.kube.registrations(t, 2))
		u0, u3 := s.inv.Devices[0].UUID, s.inv.Devices[3].UUID
		for _, id := range []string{u0 + "::0", u0 + "::1", u3 + "::2"} {
			if _, err := allocate(t, c, id); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := s.alloc.Allocate(t.Context(), "claim-z", allocator.Request{Devices: []string{s.inv.Devices[1].UUID}}); err != nil {
			t.Fatal(err)
		}
		pr.set(map[string][]string{deviceplugin.DefaultSharedResourceName: {u0 + "::1"}, "nvidia.com/gpu": {"GPU-whole"}})
		released, err := s.mgr.Reconcile(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if want := []string{deviceplugin.TimeSliceOwner(u0, 0), deviceplugin.TimeSliceOwner(u3, 2)}; !slices.Equal(released, want) {
			t.Errorf("released %v, want %v", released, want)
		}
		if got := slicesOf(t, s.alloc, u0); !slices.Equal(got, []string{deviceplugin.TimeSliceOwner(u0, 1)}) {
			t.Errorf("GPU 0 holds %v", got)
		}
		if got := slicesOf(t, s.alloc, u3); len(got) != 0 {
			t.Errorf("GPU 3 holds %v", got)
		}
		if _, err := s.alloc.Allocation("claim-z"); err != nil {
			t.Errorf("a claim was released: %v", err)
		}
		// GPU 3 is free for a claim again.
		if _, err := s.alloc.Allocate(t.Context(), "claim-w", allocator.Request{Devices: []string{u3}, Share: &allocator.Share{MemoryBytes: 1 << 30}}); err != nil {
			t.Errorf("a share of the GPU the time slices left: %v", err)
		}
	})
	t.Run("grace", func(t *testing.T) {
		s, _ := startShared(t, time.Hour)
		c := s.client(t, "nvidia.com/gpu.shared", s.kube.registrations(t, 2))
		u0 := s.inv.Devices[0].UUID
		if _, err := allocate(t, c, u0+"::0"); err != nil {
			t.Fatal(err)
		}
		if released, err := s.mgr.Reconcile(t.Context()); err != nil || len(released) > 0 {
			t.Errorf("released %v, %v within the grace", released, err)
		}
	})
	t.Run("no kubelet", func(t *testing.T) {
		s, _ := startShared(t, time.Nanosecond)
		c := s.client(t, "nvidia.com/gpu.shared", s.kube.registrations(t, 2))
		u0 := s.inv.Devices[0].UUID
		if _, err := allocate(t, c, u0+"::0"); err != nil {
			t.Fatal(err)
		}
		os.Remove(filepath.Join(s.dir, "pod-resources.sock"))
		if released, err := s.mgr.Reconcile(t.Context()); err == nil || len(released) > 0 {
			t.Errorf("released %v, %v without the kubelet", released, err)
		}
		if got := slicesOf(t, s.alloc, u0); len(got) != 1 {
			t.Errorf("GPU 0 holds %v", got)
		}
	})
}

// TestTimeSliceConfig: time slices need a source that holds them, a
// resource of their own and at least one replica.
func TestTimeSliceConfig(t *testing.T) {
	_, _, inv := testenv.SimulatedNode(t, "dgx1-volta")
	a, err := allocator.New(inv)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	u := []string{inv.Devices[0].UUID}
	for name, tt := range map[string]struct {
		src deviceplugin.Source
		cfg deviceplugin.Config
	}{
		"no time slicer":  {healthOnly{a}, deviceplugin.Config{Shared: u}},
		"same resource":   {a, deviceplugin.Config{Shared: u, SharedResourceName: "nvidia.com/gpu"}},
		"no replicas":     {a, deviceplugin.Config{Shared: u, Replicas: -1}},
		"bad shared name": {a, deviceplugin.Config{Shared: u, SharedResourceName: "shared"}},
	} {
		if _, err := deviceplugin.New(inv, tt.src, tt.cfg); !errors.Is(err, deviceplugin.ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}
}

// healthOnly is a Source that gives health and holds nothing.
type healthOnly struct{ a *allocator.Allocator }

func (h healthOnly) Devices() []node.Device { return h.a.Devices() }
