package deviceplugin_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/nomad/internal/proto/device"
)

// wantNodes are the host paths of the device nodes a task must get for
// refs: the control nodes, each GPU's node and a MIG device's capability
// nodes.
func wantNodes(inv *node.Inventory, refs ...node.DeviceRef) []string {
	var out []string
	for _, c := range inv.ControlDevices {
		out = append(out, c.Path)
	}
	for _, r := range refs {
		out = append(out, r.Node.Path)
		if r.MIG != nil {
			for _, c := range r.MIG.CapNodes() {
				out = append(out, c.Path)
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// TestReserveDevices: in devices mode, a reservation of one or two GPUs
// (or a MIG device) hands the task exactly their device nodes, the control
// nodes, the driver volume read-only and CUDA's library path, but no
// NVIDIA_VISIBLE_DEVICES; each device is held in the allocator's state, so
// that no other user of it gets it.
func TestReserveDevices(t *testing.T) {
	testenv.RequireNVIDIALibraries(t)
	for _, tc := range []struct {
		node string
		gpus [][]int // reservations, by GPU position; -1: GPU 0's first MIG device
	}{
		{"dgx1-volta", [][]int{{0}, {3, 5}}},
		{"hgx-h100-mig", [][]int{{-1}, {6}}},
	} {
		t.Run(tc.node, func(t *testing.T) {
			s := simulate(t, tc.node)
			fake := fakeNomad(t)
			fake.set(true) // holds are kept while the list cannot be read
			l := load(t, s.config(map[string]any{"nomad_addr": fake.url}))
			l.fingerprints(t).until(t, "a fingerprint", func(*device.FingerprintResponse) bool { return true })
			a := s.allocator(t)
			ctx := context.Background()
			var held []string
			for _, gpus := range tc.gpus {
				var ids []string
				var refs []node.DeviceRef
				for _, i := range gpus {
					d := s.inv.Devices[max(i, 0)]
					ref := d.Ref()
					if i < 0 {
						ref = d.MIGRef(d.MIGDevices[0])
					}
					ids = append(ids, ref.UUID)
					refs = append(refs, ref)
				}
				res, err := l.device.Reserve(ctx, &device.ReserveRequest{DeviceIds: ids})
				if err != nil {
					t.Fatal(err)
				}
				cr := res.GetContainerRes()
				var hosts []string
				for _, d := range cr.GetDevices() {
					hosts = append(hosts, d.GetHostPath())
					if !strings.HasPrefix(d.GetTaskPath(), "/dev/") || d.GetPermissions() != "rwm" {
						t.Errorf("device %v", d)
					}
				}
				slices.Sort(hosts)
				if w := wantNodes(s.inv, refs...); !slices.Equal(hosts, w) {
					t.Errorf("reserve %v: device nodes %v, want %v", ids, hosts, w)
				}
				if len(cr.GetMounts()) != 1 {
					t.Fatalf("mounts %v", cr.GetMounts())
				}
				m := cr.GetMounts()[0]
				if m.GetTaskPath() != "/usr/local/nvidia" || !m.GetReadOnly() {
					t.Errorf("mount %v", m)
				}
				if _, err := os.Stat(m.GetHostPath()); err != nil {
					t.Errorf("volume: %v", err)
				}
				envs := cr.GetEnvs()
				if _, ok := envs["NVIDIA_VISIBLE_DEVICES"]; ok {
					t.Errorf("NVIDIA_VISIBLE_DEVICES in %v", envs)
				}
				if _, ok := envs["PATH"]; ok {
					t.Errorf("PATH in %v", envs)
				}
				if !strings.Contains(envs["LD_LIBRARY_PATH"], "/usr/local/nvidia/lib64") || envs["CUDA_VISIBLE_DEVICES"] != strings.Join(ids, ",") {
					t.Errorf("environment %v", envs)
				}
				for _, id := range ids {
					held = append(held, "nomad-"+id)
				}
			}
			var owners []string
			for _, al := range a.Allocations() {
				owners = append(owners, al.Owner)
			}
			slices.Sort(owners)
			slices.Sort(held)
			if !slices.Equal(owners, held) {
				t.Fatalf("held %v, want %v", owners, held)
			}
			// What the plugin handed out is nobody else's.
			for _, o := range held {
				al, _ := a.Allocation(o)
				if _, err := a.Claim(ctx, "gpurun-1", al.Devices); err == nil {
					t.Fatalf("another user got %v, which %s holds", al.Devices, o)
				}
			}
		})
	}
}

// nomad is a fake Nomad agent's HTTP API: its own node id, and the node's
// allocations as the test sets them. Every answer to the allocation list
// is counted.
type nomad struct {
	url string

	mu     sync.Mutex
	allocs []*api.Allocation
	fail   bool
	served chan struct{}
}

const nodeID = "5e8b2b4a-0000-0000-0000-000000000001"

func fakeNomad(t *testing.T) *nomad {
	t.Helper()
	n := &nomad{served: make(chan struct{}, 1024)}
	mux := http.NewServeMux()
	reply := func(w http.ResponseWriter, v any) {
		w.Header().Set("X-Nomad-Index", "1")
		w.Header().Set("X-Nomad-KnownLeader", "true")
		w.Header().Set("X-Nomad-LastContact", "0")
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(v)
	}
	mux.HandleFunc("GET /v1/agent/self", func(w http.ResponseWriter, r *http.Request) {
		reply(w, api.AgentSelf{Stats: map[string]map[string]string{"client": {"node_id": nodeID}}})
	})
	mux.HandleFunc("GET /v1/node/{id}/allocations", func(w http.ResponseWriter, r *http.Request) {
		n.mu.Lock()
		defer n.mu.Unlock()
		defer func() { n.served <- struct{}{} }()
		if n.fail || r.PathValue("id") != nodeID {
			http.Error(w, "no cluster leader", http.StatusInternalServerError)
			return
		}
		reply(w, n.allocs)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	n.url = srv.URL
	return n
}

// set makes the allocation list allocs (fail: unreadable) from now on, and
// forgets the answers given before.
func (n *nomad) set(fail bool, allocs ...*api.Allocation) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.allocs, n.fail = allocs, fail
	for {
		select {
		case <-n.served:
		default:
			return
		}
	}
}

// answered waits until the list as set has been answered twice: the plugin
// asks again only once it acted on an answer, so by then it acted on one.
func (n *nomad) answered(t *testing.T) {
	t.Helper()
	for range 2 {
		select {
		case <-n.served:
		case <-time.After(time.Minute):
			t.Fatal("the plugin did not read the allocation list within a minute")
		}
	}
}

// alloc is an allocation of the node in client status status whose one
// task uses ids.
func alloc(id, status string, ids ...string) *api.Allocation {
	return &api.Allocation{ID: id, NodeID: nodeID, ClientStatus: status, AllocatedResources: &api.AllocatedResources{
		Tasks: map[string]*api.AllocatedTaskResources{"main": {Devices: []*api.AllocatedDeviceResource{{Vendor: "nvidia", Type: "gpu", Name: "Tesla V100-SXM2-16GB", DeviceIDs: ids}}}},
	}}
}

// TestHoldsGivenBack: a device held for a reservation is given back once
// the node's allocation list no longer has a running allocation using it,
// and kept while the list cannot be read.
func TestHoldsGivenBack(t *testing.T) {
	testenv.RequireNVIDIALibraries(t)
	s := simulate(t, "dgx1-volta")
	fake := fakeNomad(t)
	fake.set(true) // nothing given back before the list says so
	l := load(t, s.config(map[string]any{"nomad_addr": fake.url}))
	l.fingerprints(t).until(t, "a fingerprint", func(*device.FingerprintResponse) bool { return true })
	u := func(i int) string { return s.inv.Devices[i].UUID }
	ctx := context.Background()
	a := s.allocator(t)
	owners := func() []string {
		var out []string
		for _, al := range a.Allocations() {
			out = append(out, al.Owner)
		}
		slices.Sort(out)
		return out
	}
	for _, ids := range [][]string{{u(0)}, {u(1), u(2)}} {
		if _, err := l.device.Reserve(ctx, &device.ReserveRequest{DeviceIds: ids}); err != nil {
			t.Fatal(err)
		}
	}
	both := []string{"nomad-" + u(0), "nomad-" + u(1), "nomad-" + u(2)}
	slices.Sort(both)

	fake.set(false, alloc("a1", api.AllocClientStatusRunning, u(0)), alloc("a2", api.AllocClientStatusPending, u(1), u(2)))
	fake.answered(t)
	if got := owners(); !slices.Equal(got, both) {
		t.Fatalf("with both allocations running: held %v, want %v", got, both)
	}

	fake.set(false, alloc("a1", api.AllocClientStatusRunning, u(0)), alloc("a2", api.AllocClientStatusComplete, u(1), u(2)))
	fake.answered(t)
	if got, want := owners(), []string{"nomad-" + u(0)}; !slices.Equal(got, want) {
		t.Fatalf("after a2 completed: held %v, want %v", got, want)
	}
	if _, err := a.Allocate(ctx, "gpurun-1", allocator.Request{Devices: []string{u(1), u(2)}}); err != nil {
		t.Fatalf("the GPUs given back: %v", err)
	}

	fake.set(true)
	fake.answered(t)
	if got := owners(); !slices.Contains(got, "nomad-"+u(0)) {
		t.Fatalf("with the list unreadable: held %v", got)
	}

	fake.set(false)
	fake.answered(t)
	if got := owners(); !slices.Equal(got, []string{"gpurun-1"}) {
		t.Fatalf("with no allocation: held %v", got)
	}
}
