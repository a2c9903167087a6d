package allocator_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/node"
)

func migOf(tb testing.TB, al allocator.Allocation) []string {
	tb.Helper()
	var out []string
	for _, d := range al.Devices {
		if d.MIG == nil || !node.IsMIGUUID(d.UUID) {
			tb.Fatalf("allocation device %+v is not a MIG device", d)
		}
		out = append(out, fmt.Sprintf("%d/%d:%s", d.Index, d.MIG.GI, d.MIG.Profile))
	}
	return out
}

// TestMIGAllocate: MIG requests get MIG devices, packed onto the parents
// already in use; whole-GPU requests never get a GPU with MIG enabled.
func TestMIGAllocate(t *testing.T) {
	a := newAlloc(t, "hgx-h100-mig")
	steps := []struct {
		req  allocator.Request
		want []string
	}{
		// GPU 1 has the fewest free devices of the GPUs with a free 1g.10gb.
		{allocator.Request{MIG: "1g.10gb"}, []string{"1/13:1g.10gb"}},
		{allocator.Request{MIG: "1g.10gb", Count: 2}, []string{"0/7:1g.10gb", "0/8:1g.10gb"}},
		// GPU 0 is now in use: it takes the next one.
		{allocator.Request{MIG: "1g.10gb"}, []string{"0/9:1g.10gb"}},
		{allocator.Request{MIG: "3g.40gb"}, []string{"1/1:3g.40gb"}},
		// The smallest devices of at least 15 GiB: the 2g.20gb beside the
		// 3g.40gb and the 1g.10gb already held on GPU 1.
		{allocator.Request{MIGMemoryBytes: 15 << 30}, []string{"1/5:2g.20gb"}},
	}
	for i, s := range steps {
		al := allocOK(t, a, fmt.Sprintf("m%d", i), s.req)
		if got := migOf(t, al); !slices.Equal(got, s.want) {
			t.Fatalf("step %d: %v, want %v", i, got, s.want)
		}
	}
	al, _ := a.Allocation("m0")
	d := al.Devices[0]
	inv := a.Devices()
	if d.Node != inv[1].Node || d.MIG.ParentUUID != inv[1].UUID || d.UUID != inv[1].MIGDevices[2].UUID {
		t.Fatalf("MIG allocation %+v", d)
	}
	// Whole GPUs: only 4-7.
	whole := allocOK(t, a, "w", allocator.Request{Count: 4})
	if got := allocIndexes(whole); !slices.Equal(got, []int{4, 5, 6, 7}) {
		t.Fatalf("whole GPUs %v, want 4-7", got)
	}
	if _, err := a.Allocate(context.Background(), "w2", allocator.Request{Count: 1}); !errors.Is(err, allocator.ErrInsufficient) {
		t.Fatalf("fifth whole GPU: %v, want ErrInsufficient", err)
	}
	if _, err := a.Allocate(context.Background(), "w3", allocator.Request{Devices: []string{"0"}}); !errors.Is(err, allocator.ErrDeviceUnavailable) {
		t.Fatalf("GPU 0 whole: %v, want ErrDeviceUnavailable", err)
	}
	if free := a.Free(); len(free) != 0 {
		t.Fatalf("Free() = %v with MIG parents and 4-7 held", free)
	}
	if n := len(a.FreeMIG()); n != 15-6 {
		t.Fatalf("%d free MIG devices, want 9", n)
	}
	// 1g.10gb: GPU 0 has four left; a fifth request for five fails whole.
	if _, err := a.Allocate(context.Background(), "x", allocator.Request{MIG: "1g.10gb", Count: 5}); !errors.Is(err, allocator.ErrInsufficient) {
		t.Fatalf("five 1g.10gb of four: %v", err)
	}
	if _, err := a.Allocation("x"); !errors.Is(err, allocator.ErrUnknownOwner) {
		t.Fatal("failed MIG allocation left an owner")
	}
	if err := a.Release(context.Background(), "m1"); err != nil {
		t.Fatal(err)
	}
	if n := len(a.FreeMIG()); n != 15-4 {
		t.Fatalf("%d free MIG devices after a release, want 11", n)
	}
}

func TestMIGRequestErrors(t *testing.T) {
	a := newAlloc(t, "hgx-h100-mig", allocator.WithShared("7"))
	uuid := a.Devices()[0].MIGDevices[0].UUID
	allocOK(t, a, "holder", allocator.Request{Devices: []string{uuid}})
	tests := map[string]struct {
		req  allocator.Request
		want error
	}{
		"unknown profile":       {allocator.Request{MIG: "1g.5gb"}, allocator.ErrUnknownMIGProfile},
		"profile and memory":    {allocator.Request{MIG: "1g.10gb", MIGMemoryBytes: 1}, allocator.ErrInvalidRequest},
		"share of two MIG":      {allocator.Request{MIG: "1g.10gb", Count: 2, Share: &allocator.Share{MemoryBytes: 1}}, allocator.ErrInvalidRequest},
		"GPU beside MIG device": {allocator.Request{Devices: []string{"4", uuid}}, allocator.ErrInvalidRequest},
		"unknown MIG UUID":      {allocator.Request{Devices: []string{"MIG-00000000-0000-0000-0000-000000000000"}}, allocator.ErrUnknownDevice},
		"held MIG device":       {allocator.Request{Devices: []string{uuid}}, allocator.ErrDeviceUnavailable},
		"named twice":           {allocator.Request{Devices: []string{uuid, uuid}}, allocator.ErrDuplicateDevice},
		"wrong profile named":   {allocator.Request{MIG: "3g.40gb", Devices: []string{a.Devices()[0].MIGDevices[1].UUID}}, allocator.ErrDeviceUnavailable},
		"more than the node":    {allocator.Request{MIG: "1g.10gb", Count: 16}, allocator.ErrInsufficient},
		"too big":               {allocator.Request{MIGMemoryBytes: 80 << 30}, allocator.ErrInsufficient},
		"negative count":        {allocator.Request{MIG: "1g.10gb", Count: -1}, allocator.ErrInvalidRequest},
		"constraint excludes":   {allocator.Request{MIG: "3g.40gb", Constraints: []allocator.Constraint{{Attribute: "index", Operator: ">", Value: "2"}}}, allocator.ErrInsufficient},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := a.Allocate(context.Background(), "o", tt.req)
			if !errors.Is(err, tt.want) {
				t.Fatalf("Allocate = %v, want %v", err, tt.want)
			}
			if err := allocator.CheckInvariants(a); err != nil {
				t.Fatal(err)
			}
		})
	}
	if _, err := allocator.New(simInv(t, "hgx-h100-mig"), allocator.WithShared("0")); !errors.Is(err, node.ErrInvalid) {
		t.Fatalf("sharing a MIG GPU: %v", err)
	}
	if _, err := a.Resize(context.Background(), "holder", 2); !errors.Is(err, allocator.ErrInvalidRequest) {
		t.Fatalf("resize of MIG devices: %v", err)
	}
	if _, err := a.Retain(context.Background(), "holder", []string{uuid}); !errors.Is(err, allocator.ErrInvalidRequest) {
		t.Fatalf("retain of MIG devices: %v", err)
	}
	if o, err := a.Owners(uuid); err != nil || !slices.Equal(o, []string{"holder"}) {
		t.Fatalf("Owners(MIG) = %v, %v", o, err)
	}
	if o, err := a.Owners("0"); err != nil || !slices.Equal(o, []string{"holder"}) {
		t.Fatalf("Owners(parent) = %v, %v", o, err)
	}
}

// TestMIGQuota: a group's MIG devices count their parents once, as shares do.
func TestMIGQuota(t *testing.T) {
	a := newAlloc(t, "hgx-h100-mig", allocator.WithQuota("team", 1))
	allocOK(t, a, "a", allocator.Request{MIG: "1g.10gb", Group: "team", Devices: []string{a.Devices()[0].MIGDevices[0].UUID}})
	allocOK(t, a, "b", allocator.Request{MIG: "1g.10gb", Group: "team"}) // packs onto GPU 0
	_, err := a.Allocate(context.Background(), "c", allocator.Request{MIG: "3g.40gb", Group: "team"})
	var q *allocator.QuotaError
	if !errors.As(err, &q) || q.Used != 1 || q.Requested != 1 {
		t.Fatalf("second parent for the group: %v", err)
	}
	if _, err := a.Allocate(context.Background(), "d", allocator.Request{Count: 1, Group: "team"}); !errors.Is(err, allocator.ErrQuotaExceeded) {
		t.Fatalf("whole GPU over the quota: %v", err)
	}
}

// TestMIGHealth: an unhealthy MIG device, or one whose parent is unhealthy,
// is not handed out; its owners are told.
func TestMIGHealth(t *testing.T) {
	ctx := context.Background()
	a := newAlloc(t, "hgx-h100-mig")
	devs := a.Devices()
	held := allocOK(t, a, "a", allocator.Request{Devices: []string{devs[2].MIGDevices[0].UUID}})
	owners, err := a.MarkUnhealthy(ctx, devs[2].MIGDevices[0].UUID, "XID 48")
	if err != nil || !slices.Equal(owners, []string{"a"}) {
		t.Fatalf("MarkUnhealthy(MIG) = %v, %v", owners, err)
	}
	if h := a.Devices()[2].MIGDevices[0].Health; h.Healthy {
		t.Fatal("MIG device still healthy")
	}
	if _, err := a.MarkUnhealthy(ctx, devs[2].MIGDevices[1].UUID, "XID 48"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Allocate(ctx, "b", allocator.Request{MIG: "3g.40gb", Count: 2}); !errors.Is(err, allocator.ErrInsufficient) {
		t.Fatalf("two 3g.40gb with GPU 2's out of service: %v", err)
	}
	owners, err = a.MarkUnhealthy(ctx, "1", "XID 79")
	if err != nil || len(owners) != 0 {
		t.Fatalf("MarkUnhealthy(parent) = %v, %v", owners, err)
	}
	if _, err := a.Allocate(ctx, "b", allocator.Request{MIG: "3g.40gb"}); !errors.Is(err, allocator.ErrInsufficient) {
		t.Fatalf("3g.40gb with GPUs 1 and 2 out of service: %v", err)
	}
	if err := a.MarkHealthy(ctx, devs[2].MIGDevices[1].UUID); err != nil {
		t.Fatal(err)
	}
	al := allocOK(t, a, "b", allocator.Request{MIG: "3g.40gb"})
	if al.Devices[0].UUID != devs[2].MIGDevices[1].UUID || held.Devices[0].UUID == al.Devices[0].UUID {
		t.Fatalf("got %s", al.Devices[0].UUID)
	}
	if owners, _ := a.MarkUnhealthy(ctx, "2", "XID 79"); !slices.Equal(owners, []string{"a", "b"}) {
		t.Fatalf("owners of GPU 2: %v", owners)
	}
}

// TestMIGStateSurvivesRestart: MIG holdings and MIG health are on disk, and
// a MIG device that is gone after a layout change is dropped with a warning.
func TestMIGStateSurvivesRestart(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	inv := simInv(t, "hgx-h100-mig")
	a, err := allocator.New(inv, allocator.WithStateDir(dir))
	if err != nil {
		t.Fatal(err)
	}
	al := allocOK(t, a, "m", allocator.Request{MIG: "1g.20gb", Count: 2, Group: "g"})
	allocOK(t, a, "w", allocator.Request{Count: 2})
	if _, err := a.MarkUnhealthy(ctx, inv.Devices[0].MIGDevices[3].UUID, "XID 48"); err != nil {
		t.Fatal(err)
	}
	b, err := allocator.New(inv, allocator.WithStateDir(dir))
	if err != nil {
		t.Fatal(err)
	}
	got, err := b.Allocation("m")
	if err != nil || !reflect.DeepEqual(got, al) {
		t.Fatalf("after restart %+v (%v), want %+v", got, err, al)
	}
	if b.Devices()[0].MIGDevices[3].Health.Healthy {
		t.Fatal("MIG health lost in a restart")
	}
	if err := allocator.CheckInvariants(b); err != nil {
		t.Fatal(err)
	}
	// The layout changes: GPU 3 is split differently.
	changed := inv.Clone()
	changed.Devices[3].MIGDevices = changed.Devices[3].MIGDevices[:1]
	c, err := allocator.New(changed, allocator.WithStateDir(dir))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Allocation("m"); !errors.Is(err, allocator.ErrUnknownOwner) || len(c.Warnings()) != 2 {
		t.Fatalf("allocation of vanished MIG devices: %v, warnings %q", err, c.Warnings())
	}
}

// TestConcurrentMixedMIG runs random whole-GPU, shared and MIG requests,
// releases and health changes on a node with MIG on half its GPUs, from 6
// goroutines, and checks every invariant after every step: no MIG device or
// GPU held twice, no GPU with MIG enabled ever handed out whole or shared,
// no unhealthy device handed out, failed requests changing nothing.
func TestConcurrentMixedMIG(t *testing.T) {
	const workers, steps = 6, 4000
	a := newAlloc(t, "hgx-h100-mig", allocator.WithShared("7"), allocator.WithQuota("q", 3))
	migParents := map[int]bool{0: true, 1: true, 2: true, 3: true}
	profiles := []string{"1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"}
	var health sync.RWMutex
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			mine := map[string]bool{}
			fail := func(format string, args ...any) { errs <- fmt.Errorf(format, args...) }
			for step := range steps {
				op := rng.IntN(12)
				owner := fmt.Sprintf("w%d-%d", w, step)
				switch {
				case op < 6:
					var req allocator.Request
					switch op {
					case 0, 1:
						req = allocator.Request{Count: 1 + rng.IntN(3)}
					case 2:
						req = allocator.Request{Share: &allocator.Share{MemoryBytes: 1 + rng.Uint64N(20<<30)}}
					case 3:
						req = allocator.Request{MIGMemoryBytes: 1 + rng.Uint64N(40<<30), Count: 1 + rng.IntN(2)}
					default:
						req = allocator.Request{MIG: profiles[rng.IntN(len(profiles))], Count: 1 + rng.IntN(3)}
					}
					if rng.IntN(4) == 0 {
						req.Group = "q"
					}
					health.RLock()
					devs := a.Devices()
					al, err := a.Allocate(ctx, owner, req)
					health.RUnlock()
					switch {
					case err == nil:
						mine[owner] = true
						mig := req.MIG != "" || req.MIGMemoryBytes > 0
						for _, d := range al.Devices {
							if mig != (d.MIG != nil) || (!mig && migParents[d.Index]) {
								fail("step %d: %+v for %+v", step, d, req)
								return
							}
							if !devs[d.Index].Health.Healthy {
								fail("step %d: device of unhealthy gpu %d handed out", step, d.Index)
								return
							}
							if d.MIG != nil {
								k := slices.IndexFunc(devs[d.Index].MIGDevices, func(m node.MIGDevice) bool { return m.UUID == d.UUID })
								m := devs[d.Index].MIGDevices[k]
								if !m.Health.Healthy || (req.MIG != "" && m.Profile != req.MIG) || m.MemoryBytes < req.MIGMemoryBytes {
									fail("step %d: MIG device %+v for %+v", step, m, req)
									return
								}
							}
						}
						if n := max(req.Count, 1); len(al.Devices) != n {
							fail("step %d: %d devices for %+v", step, len(al.Devices), req)
							return
						}
					case errors.Is(err, node.ErrInsufficient):
						if _, err := a.Allocation(owner); !errors.Is(err, allocator.ErrUnknownOwner) {
							fail("step %d: failed allocation left %s holding", step, owner)
							return
						}
					default:
						fail("step %d: %+v: %v", step, req, err)
						return
					}
				case op < 10:
					for o := range mine {
						if err := a.Release(ctx, o); err != nil {
							fail("step %d: %v", step, err)
							return
						}
						delete(mine, o)
						break
					}
				default:
					health.Lock()
					devs := a.Devices()
					d := devs[rng.IntN(len(devs))]
					target := fmt.Sprint(d.Index)
					if len(d.MIGDevices) > 0 && rng.IntN(2) == 0 {
						target = d.MIGDevices[rng.IntN(len(d.MIGDevices))].UUID
					}
					var err error
					if op == 10 {
						_, err = a.MarkUnhealthy(ctx, target, "random")
					} else {
						err = a.MarkHealthy(ctx, target)
					}
					health.Unlock()
					if err != nil {
						fail("step %d: %v", step, err)
						return
					}
				}
				if err := allocator.CheckInvariants(a); err != nil {
					fail("step %d: %v", step, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil && !strings.Contains(err.Error(), "<nil>") {
			t.Fatal(err)
		}
	}
}
