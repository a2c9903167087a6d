package deviceplugin_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/kubernetes/deviceplugin"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
)

// wait bounds every wait for the plugin's reaction; it is a deadlock guard,
// not a measurement.
const wait = 30 * time.Second

// fakeKubelet is the kubelet's Registration service on kubelet.sock.
type fakeKubelet struct {
	pluginapi.UnimplementedRegistrationServer
	reqs   chan *pluginapi.RegisterRequest
	server *grpc.Server
}

func (k *fakeKubelet) Register(_ context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k.reqs <- r
	return &pluginapi.Empty{}, nil
}

func startKubelet(t testing.TB, dir string) *fakeKubelet {
	t.Helper()
	sock := filepath.Join(dir, "kubelet.sock")
	_ = os.Remove(sock)
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	k := &fakeKubelet{reqs: make(chan *pluginapi.RegisterRequest, 64), server: grpc.NewServer()}
	pluginapi.RegisterRegistrationServer(k.server, k)
	go k.server.Serve(l)
	t.Cleanup(k.server.Stop)
	return k
}

// registrations waits for n registrations and returns them by resource.
func (k *fakeKubelet) registrations(t *testing.T, n int) map[string]*pluginapi.RegisterRequest {
	t.Helper()
	out := map[string]*pluginapi.RegisterRequest{}
	for range n {
		select {
		case r := <-k.reqs:
			out[r.ResourceName] = r
		case <-time.After(wait):
			t.Fatalf("registrations: got %d of %d", len(out), n)
		}
	}
	return out
}

type setup struct {
	sim   *simnode.Node
	inv   *node.Inventory
	alloc *allocator.Allocator
	mgr   *deviceplugin.Manager
	dir   string
	kube  *fakeKubelet
}

// start builds a simulated node, a fake kubelet and a running manager.
func start(t testing.TB, sim string, cfg deviceplugin.Config) *setup {
	t.Helper()
	s := &setup{}
	s.sim, _, s.inv = testenv.SimulatedNode(t, sim)
	var err error
	if s.alloc, err = allocator.New(s.inv); err != nil {
		t.Fatal(err)
	}
	// Socket paths must stay under 108 bytes: a short directory.
	if s.dir, err = os.MkdirTemp("", "dp"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(s.dir) })
	cfg.Dir = s.dir
	s.kube = startKubelet(t, s.dir)
	if os.Getenv("DPDEBUG") != "" {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	if s.mgr, err = deviceplugin.New(s.inv, s.alloc, cfg); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.mgr.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("Run: %v", err)
		}
	})
	return s
}

func dial(t *testing.T, socket string) pluginapi.DevicePluginClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pluginapi.NewDevicePluginClient(conn)
}

func (s *setup) client(t *testing.T, resource string, regs map[string]*pluginapi.RegisterRequest) pluginapi.DevicePluginClient {
	t.Helper()
	r, ok := regs[resource]
	if !ok {
		t.Fatalf("resource %s not registered (have %v)", resource, keys(regs))
	}
	return dial(t, filepath.Join(s.dir, r.Endpoint))
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// TestRegister: every resource of the node is registered with the kubelet,
// MIG profiles as their own resources, and ListAndWatch lists its devices.
func TestRegister(t *testing.T) {
	tests := []struct {
		name, sim string
		cfg       deviceplugin.Config
		want      map[string]int // resource -> devices
	}{
		{name: "dgx1-volta", sim: "dgx1-volta", want: map[string]int{"nvidia.com/gpu": 8}},
		{name: "resource name", sim: "dgx1-volta", cfg: deviceplugin.Config{ResourceName: "example.com/accel"},
			want: map[string]int{"example.com/accel": 8}},
	}
	// The MIG node: its whole GPUs and one resource per profile in use.
	mig, err := simnode.New("hgx-h100-mig")
	if err != nil {
		t.Fatal(err)
	}
	migWant := map[string]int{}
	for i := range mig.Len() {
		if !mig.MIGEnabled(i) {
			migWant["nvidia.com/gpu"]++
			continue
		}
		for _, d := range mig.MIGDevices(i) {
			migWant["nvidia.com/mig-"+d.Profile]++
		}
	}
	tests = append(tests, struct {
		name, sim string
		cfg       deviceplugin.Config
		want      map[string]int
	}{name: "hgx-h100-mig", sim: "hgx-h100-mig", want: migWant})

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := start(t, tt.sim, tt.cfg)
			regs := s.kube.registrations(t, len(tt.want))
			if got := keys(regs); !slices.Equal(got, keys(tt.want)) {
				t.Fatalf("registered %v, want %v", got, keys(tt.want))
			}
			for res, n := range tt.want {
				r := regs[res]
				if r.Version != pluginapi.Version || !r.Options.GetGetPreferredAllocationAvailable() {
					t.Errorf("%s: registration %+v", res, r)
				}
				stream, err := s.client(t, res, regs).ListAndWatch(t.Context(), &pluginapi.Empty{})
				if err != nil {
					t.Fatal(err)
				}
				got, err := stream.Recv()
				if err != nil {
					t.Fatal(err)
				}
				if len(got.Devices) != n {
					t.Errorf("%s: %d devices, want %d", res, len(got.Devices), n)
				}
				for _, d := range got.Devices {
					if d.Health != pluginapi.Healthy {
						t.Errorf("%s: device %s %s", res, d.ID, d.Health)
					}
					want := "GPU-"
					if strings.Contains(res, "/mig-") {
						want = "MIG-"
					}
					if !strings.HasPrefix(d.ID, want) {
						t.Errorf("%s: device id %q", res, d.ID)
					}
				}
			}
		})
	}
}

// health returns the device's health in a ListAndWatch answer.
func health(resp *pluginapi.ListAndWatchResponse, id string) string {
	for _, d := range resp.Devices {
		if d.ID == id {
			return d.Health
		}
	}
	return "absent"
}

// TestHealth: a GPU the monitor finds lost turns Unhealthy in ListAndWatch,
// and Healthy again once it is back in service.
func TestHealth(t *testing.T) {
	s := start(t, "dgx1-volta", deviceplugin.Config{})
	regs := s.kube.registrations(t, 1)
	stream, err := s.client(t, "nvidia.com/gpu", regs).ListAndWatch(t.Context(), &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	lost := s.sim.UUID(3)
	if h := health(first, lost); h != pluginapi.Healthy {
		t.Fatalf("GPU 3 starts %s", h)
	}

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go nvmlnode.Monitor(ctx, s.sim.NVML(), s.alloc, func(nvmlnode.HealthEvent) {
		if _, err := s.mgr.Refresh(); err != nil {
			t.Error(err)
		}
	})
	if err := s.sim.Lose(3); err != nil {
		t.Fatal(err)
	}
	down, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range down.Devices {
		want := pluginapi.Healthy
		if d.ID == lost {
			want = pluginapi.Unhealthy
		}
		if d.Health != want {
			t.Errorf("after the loss: %s is %s, want %s", d.ID, d.Health, want)
		}
	}

	if err := s.sim.Restore(3); err != nil {
		t.Fatal(err)
	}
	if err := s.alloc.MarkHealthy(t.Context(), lost); err != nil {
		t.Fatal(err)
	}
	if changed, err := s.mgr.Refresh(); err != nil || !changed {
		t.Fatalf("Refresh = %v, %v", changed, err)
	}
	up, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if h := health(up, lost); h != pluginapi.Healthy {
		t.Errorf("after the recovery: GPU 3 is %s", h)
	}
}

// TestPreferredAllocation: the kubelet is told the best-connected set.
func TestPreferredAllocation(t *testing.T) {
	s := start(t, "dgx1-volta", deviceplugin.Config{})
	c := s.client(t, "nvidia.com/gpu", s.kube.registrations(t, 1))
	uuid := func(is ...int) []string {
		out := make([]string, len(is))
		for k, i := range is {
			out[k] = s.sim.UUID(i)
		}
		return out
	}
	pos := map[string]int{}
	for i := range s.sim.Len() {
		pos[s.sim.UUID(i)] = i
	}
	// best is the highest link score of size GPUs among avail with must.
	best := func(avail []int, size int, must []int) int {
		top := -1
		var rec func(start int, set []int)
		rec = func(start int, set []int) {
			if len(set) == size {
				for _, m := range must {
					if !slices.Contains(set, m) {
						return
					}
				}
				top = max(top, s.inv.Topology.SetScore(set))
				return
			}
			for k := start; k < len(avail); k++ {
				rec(k+1, append(slices.Clone(set), avail[k]))
			}
		}
		rec(0, nil)
		return top
	}
	tests := []struct {
		name  string
		avail []int
		must  []int
		size  int
	}{
		{name: "pair of eight", avail: []int{0, 1, 2, 3, 4, 5, 6, 7}, size: 2},
		{name: "four of eight", avail: []int{0, 1, 2, 3, 4, 5, 6, 7}, size: 4},
		{name: "pair with a required GPU", avail: []int{0, 1, 2, 3, 4, 5, 6, 7}, must: []int{5}, size: 2},
		{name: "pair of the odd ones", avail: []int{1, 3, 4, 6}, size: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := c.GetPreferredAllocation(t.Context(), &pluginapi.PreferredAllocationRequest{
				ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
					AvailableDeviceIDs: uuid(tt.avail...), MustIncludeDeviceIDs: uuid(tt.must...), AllocationSize: int32(tt.size),
				}},
			})
			if err != nil {
				t.Fatal(err)
			}
			ids := resp.ContainerResponses[0].DeviceIDs
			if len(ids) != tt.size {
				t.Fatalf("got %v", ids)
			}
			var set []int
			for _, id := range ids {
				p, ok := pos[id]
				if !ok || !slices.Contains(tt.avail, p) {
					t.Fatalf("%s is not available", id)
				}
				set = append(set, p)
			}
			for _, m := range tt.must {
				if !slices.Contains(set, m) {
					t.Errorf("%v lacks required GPU %d", set, m)
				}
			}
			if got, want := s.inv.Topology.SetScore(set), best(tt.avail, tt.size, tt.must); got != want {
				t.Errorf("%v scores %d, the best set %d", set, got, want)
			}
		})
	}
	t.Run("unknown device", func(t *testing.T) {
		_, err := c.GetPreferredAllocation(t.Context(), &pluginapi.PreferredAllocationRequest{
			ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{AvailableDeviceIDs: []string{"GPU-nope"}, AllocationSize: 1}},
		})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("err = %v, want InvalidArgument", err)
		}
	})
}

// TestAllocate: containers get CDI names, the environment naming their
// devices and, when asked, the device nodes.
func TestAllocate(t *testing.T) {
	tests := []struct {
		name, sim, resource string
		pick                func(*simnode.Node) []string
		specs               bool
		wantCDI             func(*simnode.Node) []string
		wantNodes           int // device specs beyond the control nodes
	}{
		{
			name: "two GPUs by CDI", sim: "dgx1-volta", resource: "nvidia.com/gpu",
			pick: func(n *simnode.Node) []string { return []string{n.UUID(0), n.UUID(1)} },
			wantCDI: func(n *simnode.Node) []string {
				return []string{"nvidia.com/gpu=" + n.UUID(0), "nvidia.com/gpu=" + n.UUID(1)}
			},
		},
		{
			name: "two GPUs with device specs", sim: "dgx1-volta", resource: "nvidia.com/gpu", specs: true,
			pick: func(n *simnode.Node) []string { return []string{n.UUID(2), n.UUID(5)} },
			wantCDI: func(n *simnode.Node) []string {
				return []string{"nvidia.com/gpu=" + n.UUID(2), "nvidia.com/gpu=" + n.UUID(5)}
			},
			wantNodes: 2,
		},
		{
			name: "a MIG device", sim: "hgx-h100-mig", resource: "nvidia.com/mig-1g.10gb", specs: true,
			pick:      func(n *simnode.Node) []string { return []string{firstMIG(n, "1g.10gb")} },
			wantCDI:   func(n *simnode.Node) []string { return []string{"nvidia.com/gpu=" + firstMIG(n, "1g.10gb")} },
			wantNodes: 3, // the parent and the GI and CI capability nodes
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := start(t, tt.sim, deviceplugin.Config{DeviceSpecs: tt.specs})
			regs := s.kube.registrations(t, len(registeredResources(t, s)))
			c := s.client(t, tt.resource, regs)
			ids := tt.pick(s.sim)
			resp, err := c.Allocate(t.Context(), &pluginapi.AllocateRequest{
				ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}},
			})
			if err != nil {
				t.Fatal(err)
			}
			cr := resp.ContainerResponses[0]
			var names []string
			for _, d := range cr.CdiDevices {
				names = append(names, d.Name)
			}
			if want := tt.wantCDI(s.sim); !slices.Equal(names, want) {
				t.Errorf("CDI devices %v, want %v", names, want)
			}
			if got, want := cr.Envs["NVIDIA_VISIBLE_DEVICES"], strings.Join(ids, ","); got != want {
				t.Errorf("NVIDIA_VISIBLE_DEVICES=%q, want %q", got, want)
			}
			ctl := 0
			for _, cd := range s.inv.ControlDevices {
				if cd.Path != "" {
					ctl++
				}
			}
			want := 0
			if tt.specs {
				want = ctl + tt.wantNodes
			}
			if len(cr.Devices) != want {
				t.Errorf("%d device specs, want %d: %v", len(cr.Devices), want, cr.Devices)
			}
			for _, d := range cr.Devices {
				if d.Permissions != "rw" || d.HostPath == "" || !strings.HasPrefix(d.ContainerPath, "/dev/") {
					t.Errorf("device spec %v", d)
				}
			}
		})
	}
	t.Run("unknown device", func(t *testing.T) {
		s := start(t, "dgx1-volta", deviceplugin.Config{})
		c := s.client(t, "nvidia.com/gpu", s.kube.registrations(t, 1))
		_, err := c.Allocate(t.Context(), &pluginapi.AllocateRequest{
			ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"GPU-nope"}}},
		})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("err = %v, want InvalidArgument", err)
		}
	})
	t.Run("device a claim holds", func(t *testing.T) {
		s := start(t, "dgx1-volta", deviceplugin.Config{})
		c := s.client(t, "nvidia.com/gpu", s.kube.registrations(t, 1))
		if _, err := s.alloc.Allocate(t.Context(), "claim-x", allocator.Request{Devices: []string{s.sim.UUID(6)}}); err != nil {
			t.Fatal(err)
		}
		_, err := c.Allocate(t.Context(), &pluginapi.AllocateRequest{
			ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{s.sim.UUID(5), s.sim.UUID(6)}}},
		})
		if status.Code(err) != codes.ResourceExhausted {
			t.Errorf("err = %v, want ResourceExhausted", err)
		}
	})
}

func registeredResources(t *testing.T, s *setup) []string {
	t.Helper()
	var out []string
	for _, p := range s.mgr.Plugins() {
		out = append(out, p.Resource())
	}
	return out
}

func firstMIG(n *simnode.Node, profile string) string {
	for i := range n.Len() {
		for _, d := range n.MIGDevices(i) {
			if d.Profile == profile {
				return n.MIGUUID(i, d.GI, d.CI)
			}
		}
	}
	return ""
}

// TestKubeletRestart: when the kubelet comes back (kubelet.sock created
// anew, the plugin sockets deleted), every plugin is served and registered
// again.
func TestKubeletRestart(t *testing.T) {
	s := start(t, "dgx1-volta", deviceplugin.Config{})
	regs := s.kube.registrations(t, 1)
	sock := filepath.Join(s.dir, regs["nvidia.com/gpu"].Endpoint)

	// The kubelet goes: its socket and every plugin socket are removed.
	s.kube.server.GracefulStop()
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		os.Remove(filepath.Join(s.dir, e.Name()))
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Fatalf("plugin socket still there: %v", err)
	}

	again := startKubelet(t, s.dir)
	regs = again.registrations(t, 1)
	stream, err := s.client(t, "nvidia.com/gpu", regs).ListAndWatch(t.Context(), &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := stream.Recv(); err != nil || len(resp.Devices) != 8 {
		t.Fatalf("after the restart: %v, %v", resp, err)
	}
}

// TestConfig: a malformed configuration is refused with ErrInvalidConfig.
func TestConfig(t *testing.T) {
	sim, err := simnode.New("dgx1-volta")
	if err != nil {
		t.Fatal(err)
	}
	inv, err := nvmlnode.Discover(context.Background(), append(sim.DiscoverOptions(nil), nvmlnode.WithDevRoot(t.TempDir()))...)
	if err != nil {
		t.Fatal(err)
	}
	a, err := allocator.New(inv)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		cfg  deviceplugin.Config
	}{
		{name: "no domain", cfg: deviceplugin.Config{ResourceName: "gpu"}},
		{name: "two slashes", cfg: deviceplugin.Config{ResourceName: "nvidia.com/gpu/x"}},
		{name: "bad CDI kind", cfg: deviceplugin.Config{CDIKind: "nope"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := deviceplugin.New(inv, a, tt.cfg); !errors.Is(err, deviceplugin.ErrInvalidConfig) {
				t.Errorf("err = %v, want ErrInvalidConfig", err)
			}
		})
	}
}

// TestMIGHealth: an XID the driver attributes to one MIG device turns that
// device alone Unhealthy in its profile's ListAndWatch.
func TestMIGHealth(t *testing.T) {
	s := start(t, "hgx-h100-mig", deviceplugin.Config{})
	regs := s.kube.registrations(t, len(registeredResources(t, s)))
	var gpu int
	var dev simnode.MIGDevice
	for i := range s.sim.Len() {
		if ds := s.sim.MIGDevices(i); len(ds) > 1 {
			gpu, dev = i, ds[0]
			break
		}
	}
	res := "nvidia.com/mig-" + dev.Profile
	stream, err := s.client(t, res, regs).ListAndWatch(t.Context(), &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go nvmlnode.Monitor(ctx, s.sim.NVML(), s.alloc, func(nvmlnode.HealthEvent) {
		if _, err := s.mgr.Refresh(); err != nil {
			t.Error(err)
		}
	})
	// The monitor registers its event sets before it waits; an XID sent
	// before that is lost, so send until the stream moves.
	bad := s.sim.MIGUUID(gpu, dev.GI, dev.CI)
	got := make(chan *pluginapi.ListAndWatchResponse, 1)
	go func() {
		r, err := stream.Recv()
		if err == nil {
			got <- r
		}
	}()
	var resp *pluginapi.ListAndWatchResponse
	deadline := time.After(wait)
	for resp == nil {
		if err := s.sim.InjectMIGXID(gpu, dev.GI, dev.CI, 48); err != nil {
			t.Fatal(err)
		}
		select {
		case resp = <-got:
		case <-time.After(100 * time.Millisecond):
		case <-deadline:
			t.Fatal("no health change")
		}
	}
	for _, d := range resp.Devices {
		want := pluginapi.Healthy
		if d.ID == bad {
			want = pluginapi.Unhealthy
		}
		if d.Health != want {
			t.Errorf("%s is %s, want %s", d.ID, d.Health, want)
		}
	}
}

// TestSocketMode: whatever the umask, every plugin's socket is 0600 (only
// root, the kubelet, may connect), and the directory holds nothing else of
// the plugins once they are registered.
func TestSocketMode(t *testing.T) {
	for _, umask := range []int{0, 0o022} {
		t.Run(fmt.Sprintf("umask %04o", umask), func(t *testing.T) {
			old := syscall.Umask(umask)
			defer syscall.Umask(old)
			s := start(t, "hgx-h100-mig", deviceplugin.Config{})
			regs := s.kube.registrations(t, len(s.mgr.Plugins()))
			want := map[string]bool{"kubelet.sock": true}
			for res, r := range regs {
				want[r.Endpoint] = true
				fi, err := os.Stat(filepath.Join(s.dir, r.Endpoint))
				if err != nil {
					t.Fatal(err)
				}
				if fi.Mode() != os.ModeSocket|0o600 {
					t.Errorf("%s: socket %s mode %v, want %v", res, r.Endpoint, fi.Mode(), os.ModeSocket|0o600)
				}
			}
			entries, err := os.ReadDir(s.dir)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range entries {
				if !want[e.Name()] {
					t.Errorf("%s left in the device-plugin directory", e.Name())
				}
			}
		})
	}
}
