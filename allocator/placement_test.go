package allocator_test

import (
	"context"
	"math/bits"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/node"
)

// key is what the topology policy maximises, in order: affinity, link
// score, then minus the links the set has to the other candidates.
type placeKey [3]int64

func placeLess(a, b placeKey) bool {
	for i := range a {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return false
}

// bruteForce enumerates every k-subset of cands (positions, ascending)
// containing must, in lexicographic order, and returns the first with the
// greatest key.
func bruteForce(topo *node.Topology, cands, must []int, k int, aff []int64) ([]int, placeKey) {
	var best []int
	var bestKey placeKey
	var set []int
	var rec func(from int)
	rec = func(from int) {
		if len(set) == k {
			for _, m := range must {
				if !slices.Contains(set, m) {
					return
				}
			}
			var kk placeKey
			for x, p := range set {
				if aff != nil {
					kk[0] += aff[p]
				}
				for _, q := range set[x+1:] {
					kk[1] += int64(topo.Score(p, q))
				}
				for _, q := range cands {
					if q != p {
						kk[2] -= int64(topo.Score(p, q))
					}
				}
			}
			if best == nil || placeLess(bestKey, kk) {
				best, bestKey = slices.Clone(set), kk
			}
			return
		}
		for i := from; i < len(cands); i++ {
			set = append(set, cands[i])
			rec(i + 1)
			set = set[:len(set)-1]
		}
	}
	rec(0)
	return best, bestKey
}

// bruteSingle applies the 1-GPU rule by enumeration: highest affinity,
// weakest strongest link to the other candidates, least total link, lowest.
func bruteSingle(topo *node.Topology, cands []int, aff []int64) int {
	best := -1
	var bk [3]int64
	for _, p := range cands {
		var mx, sum int64
		for _, q := range cands {
			if q != p {
				s := int64(topo.Score(p, q))
				mx, sum = max(mx, s), sum+s
			}
		}
		var af int64
		if aff != nil {
			af = aff[p]
		}
		k := [3]int64{af, -mx, -sum}
		if best < 0 || placeLess(bk, k) {
			best, bk = p, k
		}
	}
	return best
}

func placePositions(m uint64) []int {
	var out []int
	for m != 0 {
		p := bits.TrailingZeros64(m)
		out = append(out, p)
		m &^= 1 << p
	}
	return out
}

func checkPlacement(t *testing.T, a *allocator.Allocator, cands, must []int, k int, aff []int64) {
	t.Helper()
	topo := a.Topology()
	got := allocator.Choose(a, allocator.PolicyTopology, cands, must, k, aff)
	if len(got) != k {
		t.Fatalf("cands %v must %v k %d: got %v", cands, must, k, got)
	}
	if k == 1 && len(must) == 0 {
		if want := bruteSingle(topo, cands, aff); got[0] != want {
			t.Fatalf("cands %v k 1 aff %v: got %v, want %d", cands, aff, got, want)
		}
		return
	}
	want, _ := bruteForce(topo, cands, must, k, aff)
	if !slices.Equal(got, want) {
		t.Fatalf("cands %v must %v k %d aff %v: got %v (score %d), want %v (score %d)", cands, must, k, aff,
			got, topo.SetScore(got), want, topo.SetScore(want))
	}
	if allocator.SetScoreOf(a, got) != int64(topo.SetScore(got)) {
		t.Fatal("allocator and topology disagree on a set's score")
	}
}

// TestTopologyOptimalSmallNodes proves the topology policy optimal, with
// its tie-breaks, on every availability mask and every size of the shipped
// nodes of up to 8 GPUs.
func TestTopologyOptimalSmallNodes(t *testing.T) {
	for _, name := range []string{"dgx1-volta", "dgx1-pascal", "dgx-a100", "hgx-h100", "rtx8000x4", "pcie8"} {
		t.Run(name, func(t *testing.T) {
			a := newAlloc(t, name)
			n := a.Topology().Len()
			for mask := uint64(1); mask < 1<<n; mask++ {
				cands := placePositions(mask)
				for k := 1; k <= len(cands); k++ {
					checkPlacement(t, a, cands, nil, k, nil)
				}
			}
		})
	}
}

// TestTopologyOptimalWithMustAndAffinity covers must-include devices and
// affinities on random inputs of the 8-GPU nodes.
func TestTopologyOptimalWithMustAndAffinity(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, name := range []string{"dgx1-volta", "dgx1-pascal", "pcie8"} {
		a := newAlloc(t, name)
		for range 2000 {
			cands := placePositions(rng.Uint64N(255) + 1)
			k := 1 + rng.IntN(len(cands))
			var must []int
			for _, p := range cands {
				if len(must) < k-1 && rng.IntN(4) == 0 {
					must = append(must, p)
				}
			}
			var aff []int64
			if rng.IntN(2) == 0 {
				aff = make([]int64, 8)
				for i := range aff {
					aff[i] = int64(rng.IntN(5) - 2)
				}
			}
			checkPlacement(t, a, cands, must, k, aff)
		}
	}
}

// TestTopologyOptimalDGX2 checks thousands of random masks of the 16-GPU
// DGX-2 and of a 16-GPU node made of two DGX-1 Volta halves.
func TestTopologyOptimalDGX2(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	a := newAlloc(t, "dgx2")
	if a.Topology().Len() != 16 {
		t.Fatalf("dgx2 has %d GPUs", a.Topology().Len())
	}
	for range 3000 {
		cands := placePositions(rng.Uint64N(1<<16-1) + 1)
		k := 1 + rng.IntN(len(cands))
		checkPlacement(t, a, cands, nil, k, nil)
	}
}

func TestTopologyOptimalSixteenMixed(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	a := newTwoDGX1(t)
	for range 3000 {
		cands := placePositions(rng.Uint64N(1<<16-1) + 1)
		k := 1 + rng.IntN(len(cands))
		checkPlacement(t, a, cands, nil, k, nil)
	}
}

// newTwoDGX1 builds a 16-GPU node of two DGX-1 Volta boards joined across
// sockets: a topology with few ties, the hard case for the search.
func newTwoDGX1(t testing.TB) *allocator.Allocator {
	t.Helper()
	inv := twoDGX1Inventory(t)
	a, err := allocator.New(inv)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func twoDGX1Inventory(t testing.TB) *node.Inventory {
	t.Helper()
	base := simInv(t, "dgx1-volta")
	links := make([][]node.Link, 16)
	for i := range links {
		links[i] = make([]node.Link, 16)
		for j := range links[i] {
			switch {
			case i == j:
			case i/8 == j/8:
				links[i][j] = base.Topology.Link(i%8, j%8)
			default:
				links[i][j] = node.Link{PCIe: node.PCIeSystem}
			}
		}
	}
	topo, err := node.NewTopology(links)
	if err != nil {
		t.Fatal(err)
	}
	inv := &node.Inventory{Topology: topo, DriverVersion: base.DriverVersion}
	for i := range 16 {
		d := base.Devices[i%8].Clone()
		d.Index, d.Minor = i, i
		d.UUID = base.Devices[i%8].UUID + "-" + string(rune('a'+i/8))
		d.BusID = ""
		inv.Devices = append(inv.Devices, d)
	}
	return inv
}

// TestDGX1VoltaSequences allocates one size at a time on a full DGX-1
// Volta. Every pair is a double-NVLink pair and every quad a board half, as
// go-gpuallocator's tests expect; the order differs where its partition
// search ranks sets that score lower than the best available first.
func TestDGX1VoltaSequences(t *testing.T) {
	for _, tt := range []struct {
		size int
		want [][]int
	}{
		{2, [][]int{{2, 3}, {6, 7}, {0, 4}, {1, 5}}},
		{4, [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}},
		{8, [][]int{{0, 1, 2, 3, 4, 5, 6, 7}}},
	} {
		a := newAlloc(t, "dgx1-volta")
		topo := a.Topology()
		for i, want := range tt.want {
			al := allocOK(t, a, "job-"+string(rune('a'+i)), allocator.Request{Count: tt.size})
			got := allocIndexes(al)
			if !slices.Equal(got, want) {
				t.Errorf("size %d, job %d: got %v, want %v", tt.size, i, got, want)
			}
			if tt.size == 2 && topo.Link(got[0], got[1]).NVLinks != 2 {
				t.Errorf("size 2 set %v is not a double-NVLink pair", got)
			}
		}
	}
}

// TestSingleGPUKeepsNVLinkPairs: on 4x RTX8000 (NVLink pairs 0-3 and 1-2)
// the second 1-GPU request takes the partner of the first, where a lowest-
// index choice would split the other pair.
func TestSingleGPUKeepsNVLinkPairs(t *testing.T) {
	a := newAlloc(t, "rtx8000x4")
	var got []int
	for i := range 4 {
		got = append(got, allocIndexes(allocOK(t, a, "one-"+string(rune('a'+i)), allocator.Request{Count: 1}))...)
	}
	if !slices.Equal(got, []int{0, 3, 1, 2}) {
		t.Fatalf("1-GPU sequence %v, want [0 3 1 2]", got)
	}
}

func TestPackAndSpread(t *testing.T) {
	ctx := context.Background()
	pack := newAlloc(t, "dgx1-volta", allocator.WithPolicy(allocator.PolicyPack))
	spread := newAlloc(t, "dgx1-volta", allocator.WithPolicy(allocator.PolicySpread))
	if pack.Policy() != allocator.PolicyPack {
		t.Fatal("policy not set")
	}
	var p, s []int
	for i := range 3 {
		p = append(p, allocIndexes(allocOK(t, pack, "p"+string(rune('a'+i)), allocator.Request{Count: 1}))...)
		s = append(s, allocIndexes(allocOK(t, spread, "s"+string(rune('a'+i)), allocator.Request{Count: 1}))...)
	}
	// Pack fills NUMA node 0, switch by switch.
	if !slices.Equal(p, []int{0, 1, 2}) {
		t.Errorf("pack %v", p)
	}
	// Spread alternates NUMA nodes.
	if !slices.Equal(s, []int{0, 4, 2}) {
		t.Errorf("spread %v", s)
	}
	// Best fit: a 4-GPU job goes to the empty NUMA node.
	if got := allocIndexes(allocOK(t, pack, "quad", allocator.Request{Count: 4})); !slices.Equal(got, []int{4, 5, 6, 7}) {
		t.Errorf("pack quad %v", got)
	}
	// A 1-GPU job then fills the last GPU of NUMA node 0.
	if got := allocIndexes(allocOK(t, pack, "last", allocator.Request{Count: 1})); !slices.Equal(got, []int{3}) {
		t.Errorf("pack last %v", got)
	}
	if _, err := pack.Allocate(ctx, "none", allocator.Request{Count: 1}); err == nil {
		t.Error("full node accepted a job")
	}
}

func TestPlacementDeterministic(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	a := newAlloc(t, "dgx2")
	b := newAlloc(t, "dgx2")
	for range 200 {
		cands := placePositions(rng.Uint64N(1<<16-1) + 1)
		k := 1 + rng.IntN(len(cands))
		for _, pol := range allocator.Policies() {
			x := allocator.Choose(a, pol, cands, nil, k, nil)
			y := allocator.Choose(b, pol, cands, nil, k, nil)
			if !slices.Equal(x, y) || len(x) != k {
				t.Fatalf("%s: %v then %v", pol, x, y)
			}
		}
	}
}
