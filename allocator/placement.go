package allocator

import (
	"math"
	"math/bits"
	"slices"

	"github.com/gpuiso/gpuiso/node"
)

// exactSearchNodes bounds the topology search on nodes of more than 16
// GPUs; up to 16 the search is exhaustive (with pruning) and never reaches
// it.
const exactSearchNodes = 2_000_000

// choose returns k GPUs out of cands that include must, by policy. The
// caller guarantees must ⊆ cands and |cands| >= k >= |must|. aff holds each
// device's affinity weight (nil: none).
func (a *Allocator) choose(policy Policy, cands, must uint64, k int, aff []int64, hasAff bool) uint64 {
	if !hasAff {
		aff = nil
	}
	if bits.OnesCount64(must) == k {
		return must
	}
	switch policy {
	case PolicyPack:
		return a.greedy(cands, must, k, aff, a.packKey(cands))
	case PolicySpread:
		return a.spread(cands, must, k, aff)
	}
	if k == 1 {
		return a.single(cands, aff)
	}
	return a.best(cands, must, k, aff)
}

func (a *Allocator) score(i, j int) int64 { return a.pair[i*a.n+j] }

// SetScore is the link score of a set of GPUs by position: the sum of its
// pairs' scores.
func (a *Allocator) setScore(m uint64) int64 {
	ps := a.positions(m)
	var s int64
	for x := range ps {
		for y := x + 1; y < len(ps); y++ {
			s += a.score(ps[x], ps[y])
		}
	}
	return s
}

// single picks one GPU for a 1-GPU request: highest affinity; then the GPU
// whose strongest link to another free GPU is weakest (its departure breaks
// the least: NVLink pairs stay whole); then the one with the least total
// link to the other free GPUs (the best-connected set stays behind); then
// the lowest position.
func (a *Allocator) single(cands uint64, aff []int64) uint64 {
	best := -1
	var bAff, bMax, bSum int64
	for _, p := range a.positions(cands) {
		var af, mx, sum int64
		if aff != nil {
			af = aff[p]
		}
		for _, q := range a.positions(cands &^ (1 << p)) {
			s := a.score(p, q)
			mx = max(mx, s)
			sum += s
		}
		better := best < 0 || af > bAff ||
			af == bAff && (mx < bMax || mx == bMax && sum < bSum)
		if better {
			best, bAff, bMax, bSum = p, af, mx, sum
		}
	}
	return 1 << best
}

// best finds the k-set containing must with the highest objective:
// affinity first, then link score, then the least link to the free GPUs
// left behind (a tie-break that keeps the rest well connected), then the
// lexicographically first set. Branch and bound over the candidates in
// position order, with the objective folded into one integer.
func (a *Allocator) best(cands, must uint64, k int, aff []int64) uint64 {
	free := a.positions(cands)
	m := len(free)
	// Folding factors. Link part: pairs within the set, at most C(k,2)
	// times maxLnk. Tie part: sum over the set of links to other
	// candidates, at most k*(m-1)*maxLnk.
	maxLnk := max(a.maxLnk, 1)
	tieRange := int64(k)*int64(m)*maxLnk + 1
	linkRange := int64(k*(k-1)/2)*maxLnk + 1
	var affMax int64
	for _, p := range free {
		if aff != nil {
			affMax = max(affMax, abs64(aff[p]))
		}
	}
	tie := true
	if float64(int64(k)*affMax+1)*float64(linkRange)*float64(tieRange) > math.MaxInt64/8 {
		tie, tieRange = false, 1 // only with many GPUs and affinities: drop the tie-break
	}
	affW := linkRange * tieRange // weight of one affinity point
	// Node weights: affinity, minus the links to the other candidates
	// (the tie-break). Pair weights: link score times tieRange (x2 to keep
	// the bound integral).
	node := make([]int64, a.n)
	for _, p := range free {
		var deg int64
		for _, q := range free {
			if q != p {
				deg += a.score(p, q)
			}
		}
		if aff != nil {
			node[p] = aff[p] * affW
		}
		if tie {
			node[p] -= deg
		}
	}
	pairW := func(i, j int) int64 { return a.score(i, j) * tieRange }

	// Candidates to choose from, in position order; chosen starts as must.
	var rest []int
	for _, p := range free {
		if must&(1<<p) == 0 {
			rest = append(rest, p)
		}
	}
	r0 := k - bits.OnesCount64(must)
	// gain[j]: node weight of rest[j] plus its pair weights to the chosen.
	gain := make([]int64, len(rest))
	var cur int64
	mustPos := a.positions(must)
	for x, p := range mustPos {
		cur += node[p]
		for _, q := range mustPos[x+1:] {
			cur += pairW(p, q)
		}
	}
	for j, p := range rest {
		gain[j] = node[p]
		for _, q := range mustPos {
			gain[j] += pairW(p, q)
		}
	}
	// top[j][t]: the sum of the t largest pair weights from rest[j] to the
	// other candidates of rest: bounds the pairs a j can add among the
	// new ones.
	top := make([][]int64, len(rest))
	ws := make([]int64, 0, len(rest))
	for j, p := range rest {
		ws = ws[:0]
		for _, q := range rest {
			if q != p {
				ws = append(ws, pairW(p, q))
			}
		}
		slices.Sort(ws)
		slices.Reverse(ws)
		top[j] = make([]int64, r0)
		var s int64
		for t := 1; t < r0; t++ {
			if t-1 < len(ws) {
				s += ws[t-1]
			}
			top[j][t] = s
		}
	}

	var (
		bestSet  uint64
		bestVal  int64
		found    bool
		nodes    int
		pick     = make([]int, 0, k)
		scratch  = make([]int64, 0, len(rest))
		capNodes = a.n > 16
	)
	// bound2 is twice an upper bound on what r more picks from rest[pos:]
	// can add.
	bound2 := func(pos, r int) int64 {
		scratch = scratch[:0]
		for j := pos; j < len(rest); j++ {
			scratch = append(scratch, 2*gain[j]+top[j][r-1])
		}
		// Sum of the r largest.
		var s int64
		for t := 0; t < r; t++ {
			bi := t
			for u := t + 1; u < len(scratch); u++ {
				if scratch[u] > scratch[bi] {
					bi = u
				}
			}
			scratch[t], scratch[bi] = scratch[bi], scratch[t]
			s += scratch[t]
		}
		return s
	}
	var dfs func(pos, r int, cur int64)
	dfs = func(pos, r int, cur int64) {
		nodes++
		if r == 0 {
			if !found || cur > bestVal {
				found, bestVal = true, cur
				bestSet = must
				for _, j := range pick {
					bestSet |= 1 << rest[j]
				}
			}
			return
		}
		if len(rest)-pos < r || capNodes && found && nodes > exactSearchNodes {
			return
		}
		if found && 2*cur+bound2(pos, r) <= 2*bestVal {
			return
		}
		for j := pos; j <= len(rest)-r; j++ {
			p := rest[j]
			add := gain[j]
			for t := j + 1; t < len(rest); t++ {
				gain[t] += pairW(p, rest[t])
			}
			pick = append(pick, j)
			dfs(j+1, r-1, cur+add)
			pick = pick[:len(pick)-1]
			for t := j + 1; t < len(rest); t++ {
				gain[t] -= pairW(p, rest[t])
			}
			if len(rest)-(j+1) < r || found && 2*cur+bound2(j+1, r) <= 2*bestVal {
				return
			}
		}
	}
	dfs(0, r0, cur)
	return bestSet
}

func abs64(v int64) int64 {
	if v < 0 {
		return -v
	}
	return v
}

// packKey orders GPUs for PolicyPack: a NUMA node that can hold the request
// before one that cannot, fuller NUMA nodes and PCIe switches first, then
// position.
func (a *Allocator) packKey(cands uint64) func(p, need int) [4]int {
	numaFree := make([]int, a.groups)
	swFree := make([]int, a.n)
	for m := cands; m != 0; m &= m - 1 {
		p := bits.TrailingZeros64(m)
		numaFree[a.numa[p]]++
		swFree[a.sw[p]]++
	}
	return func(p, need int) [4]int {
		nf := numaFree[a.numa[p]]
		fits := 1
		if nf >= need {
			fits = 0
		}
		return [4]int{fits, nf, swFree[a.sw[p]], p}
	}
}

// switchOf maps each GPU to the lowest position behind the same PCIe switch
// (or board).
func (a *Allocator) switchOf() []int {
	sw := make([]int, a.n)
	for p := range a.n {
		sw[p] = p
		for q := range p {
			if a.inv.Topology.Link(p, q).PCIe >= node.PCIeSingleSwitch {
				sw[p] = sw[q]
				break
			}
		}
	}
	return sw
}

// greedy takes must plus the k-|must| candidates with the smallest keys
// (highest affinity first).
func (a *Allocator) greedy(cands, must uint64, k int, aff []int64, key func(p, need int) [4]int) uint64 {
	need := k - bits.OnesCount64(must)
	rest := a.positions(cands &^ must)
	type ranked struct {
		aff int64
		key [4]int
	}
	rk := make([]ranked, a.n)
	for _, p := range rest {
		rk[p].key = key(p, need)
		if aff != nil {
			rk[p].aff = -aff[p]
		}
	}
	slices.SortStableFunc(rest, func(x, y int) int {
		if rk[x].aff != rk[y].aff {
			return cmpInt64(rk[x].aff, rk[y].aff)
		}
		for t := range rk[x].key {
			if rk[x].key[t] != rk[y].key[t] {
				return rk[x].key[t] - rk[y].key[t]
			}
		}
		return 0
	})
	set := must
	for _, p := range rest[:need] {
		set |= 1 << p
	}
	return set
}

func cmpInt64(x, y int64) int {
	switch {
	case x < y:
		return -1
	case x > y:
		return 1
	}
	return 0
}

// spread takes GPUs one at a time from the NUMA node with the most free
// candidates left (ties: the lower node), within it from the PCIe switch with
// the most left, then the lowest position; higher affinity first.
func (a *Allocator) spread(cands, must uint64, k int, aff []int64) uint64 {
	set := must
	left := cands &^ must
	sw := a.sw
	numaLeft := make([]int, a.groups)
	swLeft := make([]int, a.n)
	for bits.OnesCount64(set) < k {
		clear(numaLeft)
		clear(swLeft)
		for _, p := range a.positions(left) {
			numaLeft[a.numa[p]]++
			swLeft[sw[p]]++
		}
		best := -1
		for _, p := range a.positions(left) {
			if best < 0 {
				best = p
				continue
			}
			if aff != nil && aff[p] != aff[best] {
				if aff[p] > aff[best] {
					best = p
				}
				continue
			}
			np, nb := a.numa[p], a.numa[best]
			switch {
			case numaLeft[np] > numaLeft[nb], numaLeft[np] == numaLeft[nb] && a.inv.Devices[p].NUMANode < a.inv.Devices[best].NUMANode:
				best = p
			case np == nb && swLeft[sw[p]] > swLeft[sw[best]]:
				best = p
			}
		}
		set |= 1 << best
		left &^= 1 << best
	}
	return set
}
