package allocator_test

import (
	"context"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/NVIDIA/go-gpuallocator/gpuallocator"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/node"
)

// theirDevices builds go-gpuallocator's devices for a topology, the way its
// NewDevices does from NVML: one P2PLink for the PCIe level and one for the
// NVLink count of every pair, with its link types (PCIe levels 1..6, then
// 1..18 NVLinks).
func theirDevices(topo *node.Topology) []*gpuallocator.Device {
	n := topo.Len()
	devs := make([]*gpuallocator.Device, n)
	for i := range devs {
		devs[i] = &gpuallocator.Device{Index: i, Links: map[int][]gpuallocator.P2PLink{}}
	}
	linkType := func(steps int) (t gpuallocator.P2PLink) {
		for range steps {
			t.Type++
		}
		return t
	}
	for i := range n {
		for j := range n {
			if i == j {
				continue
			}
			l := topo.Link(i, j)
			if l.PCIe != node.PCIeUnknown {
				p := linkType(int(l.PCIe)) // same order as go-gpuallocator's P2PLinkCrossCPU..SameBoard
				p.GPU = devs[j]
				devs[i].Links[j] = append(devs[i].Links[j], p)
			}
			if l.NVLinks > 0 {
				p := linkType(int(node.PCIeSameBoard) + l.NVLinks)
				p.GPU = devs[j]
				devs[i].Links[j] = append(devs[i].Links[j], p)
			}
		}
	}
	return devs
}

// theirScore scores a set with go-gpuallocator's weights: 10..60 for the
// PCIe link types, 100 per NVLink.
func theirScore(devs []*gpuallocator.Device, set []int) int {
	s := 0
	for x, i := range set {
		for _, j := range set[x+1:] {
			for _, l := range devs[i].Links[j] {
				t := int(l.Type)
				if t <= int(node.PCIeSameBoard) {
					s += 10 * t
				} else {
					s += 100 * (t - int(node.PCIeSameBoard))
				}
			}
		}
	}
	return s
}

func theirChoice(devs []*gpuallocator.Device, cands []int, size int) []int {
	avail := make([]*gpuallocator.Device, len(cands))
	for x, p := range cands {
		avail[x] = devs[p]
	}
	got := gpuallocator.NewBestEffortPolicy().Allocate(avail, nil, size)
	var out []int
	for _, d := range got {
		if d != nil {
			out = append(out, d.Index)
		}
	}
	sort.Ints(out)
	return out
}

type benchCase struct {
	topology string
	mask     string
	cands    []int
}

func benchPositions(m uint64) []int {
	var out []int
	for m != 0 {
		p := bits.TrailingZeros64(m)
		out = append(out, p)
		m &^= 1 << p
	}
	return out
}

// BenchmarkPlace compares the topology policy with go-gpuallocator's
// best-effort policy on identical inputs. Each reports the chosen set's
// score under go-gpuallocator's weights. go-gpuallocator enumerates every
// partition of the free GPUs: on 16 GPUs, sizes 3 and 4 run for minutes and
// are left out unless GPUISO_BENCH_SLOW=1.
func BenchmarkPlace(b *testing.B) {
	cases := []benchCase{
		{"dgx1-volta", "all", benchPositions(0xff)},
		{"dgx1-volta", "0-2,4-6", benchPositions(0x77)},
		{"dgx1-volta", "1,3-6", benchPositions(0x7a)},
		{"dgx1-volta", "1-6", benchPositions(0x7e)},
		{"dgx2", "all", benchPositions(0xffff)},
		{"dgx2", "odd", benchPositions(0xaaaa)},
		{"2xdgx1-volta", "all", benchPositions(0xffff)},
	}
	slow := os.Getenv("GPUISO_BENCH_SLOW") != ""
	for _, c := range cases {
		var a *allocator.Allocator
		if c.topology == "2xdgx1-volta" {
			a = newTwoDGX1(b)
		} else {
			a = newAlloc(b, c.topology)
		}
		devs := theirDevices(a.Topology())
		sizes := []int{1, 2, 3, 4}
		if a.Topology().Len() == 16 {
			sizes = []int{2, 3, 4}
		}
		for _, size := range sizes {
			if size > len(c.cands) {
				continue
			}
			name := fmt.Sprintf("topology=%s/free=%s/size=%d", c.topology, c.mask, size)
			b.Run(name+"/impl=gpuiso", func(b *testing.B) {
				var got []int
				for b.Loop() {
					got = allocator.Choose(a, allocator.PolicyTopology, c.cands, nil, size, nil)
				}
				b.ReportMetric(float64(theirScore(devs, got)), "score")
			})
			b.Run(name+"/impl=gpuallocator", func(b *testing.B) {
				if len(c.cands) > 8 && size > 2 && !slow {
					b.Skip("minutes per call; set GPUISO_BENCH_SLOW=1")
				}
				var got []int
				for b.Loop() {
					got = theirChoice(devs, c.cands, size)
				}
				b.ReportMetric(float64(theirScore(devs, got)), "score")
			})
		}
	}
}

// BenchmarkPlaceLatency times single topology decisions over random
// availability masks and sizes and reports their p50 and p99.
func BenchmarkPlaceLatency(b *testing.B) {
	for _, name := range []string{"dgx1-volta", "dgx2", "2xdgx1-volta"} {
		b.Run("topology="+name, func(b *testing.B) {
			var a *allocator.Allocator
			if name == "2xdgx1-volta" {
				a = newTwoDGX1(b)
			} else {
				a = newAlloc(b, name)
			}
			n := a.Topology().Len()
			rng := rand.New(rand.NewPCG(1, 1))
			type input struct {
				cands []int
				k     int
			}
			inputs := make([]input, 4096)
			for i := range inputs {
				c := benchPositions(rng.Uint64N(1<<n-1) + 1)
				inputs[i] = input{c, 1 + rng.IntN(len(c))}
			}
			lat := make([]time.Duration, 0, len(inputs))
			i := 0
			for b.Loop() {
				in := inputs[i%len(inputs)]
				i++
				start := time.Now()
				allocator.Choose(a, allocator.PolicyTopology, in.cands, nil, in.k, nil)
				if len(lat) < cap(lat) {
					lat = append(lat, time.Since(start))
				}
			}
			slices.Sort(lat)
			if len(lat) > 0 {
				b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
				b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
			}
		})
	}
}

// BenchmarkAllocateRelease measures one Allocate and one Release, in
// memory and with a state directory (every change synced to disk).
func BenchmarkAllocateRelease(b *testing.B) {
	ctx := context.Background()
	for _, pol := range allocator.Policies() {
		for _, durable := range []bool{false, true} {
			state := "memory"
			if durable {
				state = "disk"
			}
			b.Run(fmt.Sprintf("policy=%s/state=%s", pol, state), func(b *testing.B) {
				opts := []allocator.Option{allocator.WithPolicy(pol)}
				if durable {
					opts = append(opts, allocator.WithStateDir(b.TempDir()))
				}
				a := newAlloc(b, "dgx1-volta", opts...)
				allocOK(b, a, "resident", allocator.Request{Count: 3})
				req := allocator.Request{Count: 2}
				for b.Loop() {
					if _, err := a.Allocate(ctx, "task", req); err != nil {
						b.Fatal(err)
					}
					if err := a.Release(ctx, "task"); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(2*b.N)/b.Elapsed().Seconds(), "ops/s")
			})
		}
	}
}

// BenchmarkAllocateConstrained measures one Allocate and one Release, in
// memory, of a request whose constraints and affinity each device of the
// node is tested against: a regular expression, version conditions and a
// quantity.
func BenchmarkAllocateConstrained(b *testing.B) {
	ctx := context.Background()
	a := newAlloc(b, "dgx1-volta")
	req := allocator.Request{
		Count: 2,
		Constraints: []allocator.Constraint{
			{Attribute: "model", Operator: allocator.OpRegexp, Value: "^Tesla V100(-SXM2)?(-16GB)?$"},
			{Attribute: "compute_capability", Operator: allocator.OpVersion, Value: ">= 7.0, < 9"},
			{Attribute: "memory", Operator: allocator.OpGreaterEqual, Value: "8 GiB"},
		},
		Affinities: []allocator.Affinity{{Constraint: allocator.Constraint{Attribute: "model", Operator: allocator.OpRegexp, Value: "V100"}, Weight: 50}},
	}
	for b.Loop() {
		if _, err := a.Allocate(ctx, "task", req); err != nil {
			b.Fatal(err)
		}
		if err := a.Release(ctx, "task"); err != nil {
			b.Fatal(err)
		}
	}
}

// TestScoreNotBelowGoGPUAllocator: on every availability mask and size of
// the 8-GPU nodes, the topology policy's set scores at least as much as
// go-gpuallocator's best-effort choice, under go-gpuallocator's weights.
func TestScoreNotBelowGoGPUAllocator(t *testing.T) {
	better := 0
	for _, name := range []string{"dgx1-volta", "dgx1-pascal", "rtx8000x4"} {
		a := newAlloc(t, name)
		devs := theirDevices(a.Topology())
		n := a.Topology().Len()
		for mask := uint64(1); mask < 1<<n; mask++ {
			cands := benchPositions(mask)
			for k := 2; k <= min(4, len(cands)); k++ {
				ours := allocator.Choose(a, allocator.PolicyTopology, cands, nil, k, nil)
				theirs := theirChoice(devs, cands, k)
				oursScore, ts := theirScore(devs, ours), theirScore(devs, theirs)
				if oursScore != a.Topology().SetScore(ours) {
					t.Fatalf("%s: weights differ: %d vs %d", name, oursScore, a.Topology().SetScore(ours))
				}
				if len(theirs) == k && oursScore < ts {
					t.Fatalf("%s %v size %d: ours %v scores %d, go-gpuallocator's %v %d", name, cands, k, ours, oursScore, theirs, ts)
				}
				if oursScore > ts {
					better++
				}
			}
		}
	}
	t.Logf("higher score than go-gpuallocator in %d cases", better)
}
