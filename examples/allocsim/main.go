// Command allocsim replays a seeded synthetic workload of 1, 2, 4 and 8-GPU
// jobs arriving and leaving on a simulated node, once per placement policy,
// and prints how each policy did: jobs accepted and rejected, the mean link
// score of the placements, how often a k-GPU job got an NVLink-complete
// set, fragmentation, and decision latency. It needs no GPU and no root.
package main

import (
	"container/heap"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/bits"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/internal/cli"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
)

func main() {
	ctx, _, stop := cli.NotifyContext(context.Background())
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// job is one arrival of the workload.
type job struct {
	arrive, duration float64
	size             int
}

// workload draws n jobs: exponential inter-arrival times of mean 1, sizes
// 1, 2, 4, 8 (weights 4:3:2:1, those larger than the node left out), and
// durations sized so that the offered load is load times the node's GPUs.
func workload(seed uint64, n, gpus int, load float64) []job {
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	sizes, weights := []int{}, []float64{}
	for i, s := range []int{1, 2, 4, 8} {
		if s <= gpus {
			sizes = append(sizes, s)
			weights = append(weights, []float64{4, 3, 2, 1}[i])
		}
	}
	var total, mean float64
	for i, w := range weights {
		total += w
		mean += w * float64(sizes[i])
	}
	mean /= total
	meanDuration := load * float64(gpus) / mean
	jobs := make([]job, n)
	t := 0.0
	for i := range jobs {
		t += rng.ExpFloat64()
		x, size := rng.Float64()*total, sizes[len(sizes)-1]
		for k, w := range weights {
			if x < w {
				size = sizes[k]
				break
			}
			x -= w
		}
		jobs[i] = job{arrive: t, duration: rng.ExpFloat64() * meanDuration, size: size}
	}
	return jobs
}

// result is one policy's tally.
type result struct {
	policy             allocator.Policy
	accepted, rejected int
	pairScore          float64 // sum over placements of >= 2 GPUs of score per pair
	scored             int
	complete, asked    map[int]int // by size: NVLink-complete placements, accepted jobs
	fragmentation      float64     // sum over arrivals
	arrivals           int
	latency            []time.Duration
}

type departure struct {
	at    float64
	owner string
}

type departures []departure

func (d departures) Len() int           { return len(d) }
func (d departures) Less(i, j int) bool { return d[i].at < d[j].at }
func (d departures) Swap(i, j int)      { d[i], d[j] = d[j], d[i] }
func (d *departures) Push(x any)        { *d = append(*d, x.(departure)) }
func (d *departures) Pop() any {
	old := *d
	x := old[len(old)-1]
	*d = old[:len(old)-1]
	return x
}

// simulate replays jobs on a fresh allocator with policy.
func simulate(ctx context.Context, inv *node.Inventory, policy allocator.Policy, jobs []job) (*result, error) {
	a, err := allocator.New(inv, allocator.WithPolicy(policy))
	if err != nil {
		return nil, err
	}
	topo := inv.Topology
	n := topo.Len()
	adj := make([]uint64, n)
	for i := range n {
		for j := range n {
			if i != j && topo.Link(i, j).NVLinks > 0 {
				adj[i] |= 1 << j
			}
		}
	}
	res := &result{policy: policy, complete: map[int]int{}, asked: map[int]int{}}
	var pending departures
	for i, jb := range jobs {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		for len(pending) > 0 && pending[0].at <= jb.arrive {
			d := heap.Pop(&pending).(departure)
			if err := a.Release(ctx, d.owner); err != nil {
				return nil, err
			}
		}
		var free uint64
		for _, p := range a.Free() {
			free |= 1 << p
		}
		if f := bits.OnesCount64(free); f > 0 {
			res.fragmentation += 1 - float64(maxClique(adj, free))/float64(f)
			res.arrivals++
		} else {
			res.arrivals++
		}
		owner := fmt.Sprintf("job-%d", i)
		start := time.Now()
		al, err := a.Allocate(ctx, owner, allocator.Request{Count: jb.size})
		res.latency = append(res.latency, time.Since(start))
		if errors.Is(err, node.ErrInsufficient) {
			res.rejected++
			continue
		}
		if err != nil {
			return nil, err
		}
		res.accepted++
		heap.Push(&pending, departure{at: jb.arrive + jb.duration, owner: owner})
		set := make([]int, len(al.Devices))
		for k, d := range al.Devices {
			set[k] = d.Index
		}
		res.asked[jb.size]++
		if jb.size >= 2 {
			res.pairScore += float64(topo.SetScore(set)) / float64(jb.size*(jb.size-1)/2)
			res.scored++
		}
		if nvlinkComplete(topo, set) {
			res.complete[jb.size]++
		}
	}
	return res, nil
}

// nvlinkComplete tells whether every pair of set shares an NVLink.
func nvlinkComplete(topo *node.Topology, set []int) bool {
	for x, i := range set {
		for _, j := range set[x+1:] {
			if topo.Link(i, j).NVLinks == 0 {
				return false
			}
		}
	}
	return true
}

// maxClique is the size of the largest set of GPUs in cand that are all
// NVLinked to each other.
func maxClique(adj []uint64, cand uint64) int {
	best := 0
	var grow func(size int, cand uint64)
	grow = func(size int, cand uint64) {
		if cand == 0 {
			best = max(best, size)
			return
		}
		for cand != 0 {
			if size+bits.OnesCount64(cand) <= best {
				return
			}
			v := bits.TrailingZeros64(cand)
			cand &^= 1 << v
			grow(size+1, cand&adj[v])
		}
		best = max(best, size)
	}
	grow(0, cand)
	return best
}

func percentile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(math.Ceil(q*float64(len(s))))-1)]
}

const usage = `usage: allocsim [--topology NAME] [--seed N] [--jobs N] [--load F] [--policies LIST]

Replay a seeded workload of 1, 2, 4 and 8-GPU jobs on a simulated node once
per placement policy, and say how each did and which did best. No GPU and no
root needed.
`

// maxJobs bounds --jobs: the workload is held in memory (tens of bytes a job).
const maxJobs = 10_000_000

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("allocsim", flag.ContinueOnError)
	topology := fs.String("topology", "dgx1-volta", "the simulated node `NAME`: "+strings.Join(simnode.Names(), ", "))
	seed := fs.Uint64("seed", 1, "workload seed")
	jobs := fs.Int("jobs", 5000, "number of jobs")
	load := fs.Float64("load", 0.9, "offered load, as a fraction of the node's GPUs")
	policies := fs.String("policies", "topology,pack,spread", "comma-separated policies to compare")
	if code, done := cli.Parse(fs, args, usage, stdout, stderr); done {
		return code
	}
	switch {
	case fs.NArg() > 0:
		return cli.Usagef(stderr, "allocsim", "unexpected arguments %q", fs.Args())
	case *jobs <= 0 || *jobs > maxJobs:
		return cli.Usagef(stderr, "allocsim", "--jobs %d: want 1 to %d", *jobs, maxJobs)
	case !(*load > 0) || math.IsInf(*load, 0):
		return cli.Usagef(stderr, "allocsim", "--load %v: want a finite number above 0", *load)
	}
	var pols []allocator.Policy
	for _, p := range strings.Split(*policies, ",") {
		pol := allocator.Policy(strings.TrimSpace(p))
		if !slices.Contains(allocator.Policies(), pol) {
			return cli.Usagef(stderr, "allocsim", "--policies: unknown policy %q (topology, pack or spread)", p)
		}
		pols = append(pols, pol)
	}
	node, err := simnode.New(*topology)
	if err != nil {
		return cli.Usagef(stderr, "allocsim", "--topology: %v", err)
	}
	dir, err := os.MkdirTemp("", "allocsim-")
	if err != nil {
		return cli.Errorf(stderr, "allocsim", "%v", err)
	}
	defer os.RemoveAll(dir)
	inv, err := nvmlnode.Discover(ctx, nvmlnode.WithNVML(node.NVML()),
		nvmlnode.WithDevRoot(dir), nvmlnode.WithProcRoot(dir), nvmlnode.WithSysRoot(dir))
	if err != nil {
		return cli.Errorf(stderr, "allocsim", "%v", err)
	}
	gpus := 0 // whole GPUs: those with MIG enabled go by MIG device
	for _, d := range inv.Devices {
		if !d.MIGSplit() {
			gpus++
		}
	}
	work := workload(*seed, *jobs, gpus, *load)
	var results []*result
	for _, pol := range pols {
		r, err := simulate(ctx, inv, pol, work)
		if err != nil {
			return cli.Errorf(stderr, "allocsim", "%s: %v", pol, err)
		}
		results = append(results, r)
	}
	report(stdout, *topology, gpus, *seed, *jobs, *load, results)
	if hasMIG(inv) {
		mwork := migWorkload(*seed, *jobs, inv, *load)
		var mres []*migResult
		for _, spread := range []bool{false, true} {
			r, err := simulateMIG(ctx, inv, mwork, spread)
			if err != nil {
				return cli.Errorf(stderr, "allocsim", "MIG workload: %v", err)
			}
			mres = append(mres, r)
		}
		reportMIG(stdout, *jobs, *load, mres)
	}
	return 0
}

func report(w io.Writer, topology string, gpus int, seed uint64, jobs int, load float64, results []*result) {
	fmt.Fprintf(w, "node %s (%d whole GPUs), seed %d, %d jobs of 1/2/4/8 GPUs, offered load %.2f\n\n", topology, gpus, seed, jobs, load)
	var sizes []int
	for _, s := range []int{2, 4, 8} {
		if s <= gpus {
			sizes = append(sizes, s)
		}
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := "policy\taccepted\trejected\tpair score\t"
	for _, s := range sizes {
		head += fmt.Sprintf("NVL k=%d\t", s)
	}
	head += "frag\tp50\tp99\t"
	fmt.Fprintln(tw, head)
	for _, r := range results {
		line := fmt.Sprintf("%s\t%d\t%d\t%.1f\t", r.policy, r.accepted, r.rejected, r.pairScore/float64(max(r.scored, 1)))
		for _, s := range sizes {
			if r.asked[s] == 0 {
				line += "-\t"
				continue
			}
			line += fmt.Sprintf("%.1f%%\t", 100*float64(r.complete[s])/float64(r.asked[s]))
		}
		line += fmt.Sprintf("%.3f\t%s\t%s\t", r.fragmentation/float64(max(r.arrivals, 1)),
			percentile(r.latency, 0.50).Round(100*time.Nanosecond), percentile(r.latency, 0.99).Round(100*time.Nanosecond))
		fmt.Fprintln(tw, line)
	}
	tw.Flush()
	fmt.Fprintln(w, "\npair score: a placement's link score per GPU pair (NVLink 100 a link, PCIe 10-60), jobs of 2+")
	fmt.Fprintln(w, "NVL k=N: share of accepted N-GPU jobs whose GPUs are all NVLinked pairwise")
	fmt.Fprintln(w, "frag: mean share of free GPUs outside the largest NVLink-complete free group, at each arrival")
	fmt.Fprintln(w, "p50, p99: latency of one decision (varies between runs; the rest does not)")
	fmt.Fprintln(w, "best: most jobs accepted; then NVLink-complete share of all 2+ GPU jobs; then pair score")
	if v := verdict(topology, results); v != "" {
		fmt.Fprintln(w, "\n"+v)
	}
}

// verdict is one line naming the policy that did best and why: the most
// jobs accepted (within half a percent counts as as many), then the
// largest share of multi-GPU jobs given an NVLink-complete set, then the
// highest pair score.
func verdict(topology string, results []*result) string {
	if len(results) < 2 {
		return ""
	}
	complete := func(r *result) float64 {
		var c, a int
		for k, n := range r.asked {
			if k >= 2 {
				c, a = c+r.complete[k], a+n
			}
		}
		if a == 0 {
			return 0
		}
		return float64(c) / float64(a)
	}
	pair := func(r *result) float64 { return r.pairScore / float64(max(r.scored, 1)) }
	// The most jobs accepted decides first.
	most := slices.MaxFunc(results, func(a, b *result) int { return a.accepted - b.accepted })
	var near []*result
	for _, r := range results {
		if float64(r.accepted) >= 0.995*float64(most.accepted) {
			near = append(near, r)
		}
	}
	if len(near) == 1 {
		var others []string
		for _, r := range results {
			if r != most {
				others = append(others, fmt.Sprintf("%s %d", r.policy, r.accepted))
			}
		}
		return fmt.Sprintf("best on %s: %s (most jobs accepted: %d; %s)", topology, most.policy, most.accepted, strings.Join(others, ", "))
	}
	// Compared as the line shows them (0.1%, 0.1): smaller differences are ties.
	type key struct{ complete, pair int }
	keyOf := func(r *result) key {
		return key{int(math.Round(1000 * complete(r))), int(math.Round(10 * pair(r)))}
	}
	cmpKey := func(a, b key) int {
		if a.complete != b.complete {
			return a.complete - b.complete
		}
		return a.pair - b.pair
	}
	top := keyOf(slices.MaxFunc(near, func(a, b *result) int { return cmpKey(keyOf(a), keyOf(b)) }))
	var winners []string
	var rest []*result
	for _, r := range near {
		if keyOf(r) == top {
			winners = append(winners, string(r.policy))
		} else {
			rest = append(rest, r)
		}
	}
	if len(rest) == 0 {
		return fmt.Sprintf("on %s the policies did equally well", topology)
	}
	byComplete := slices.ContainsFunc(rest, func(r *result) bool { return keyOf(r).complete != top.complete })
	var others []string
	for _, r := range rest {
		switch {
		case byComplete && keyOf(r).complete == top.complete: // lost on pair score
			others = append(others, fmt.Sprintf("%s too, lower pair score", r.policy))
		case byComplete:
			others = append(others, fmt.Sprintf("%s %.1f%%", r.policy, 100*complete(r)))
		default:
			others = append(others, fmt.Sprintf("%s %.1f", r.policy, pair(r)))
		}
	}
	who := strings.Join(winners, " and ")
	if byComplete {
		return fmt.Sprintf("best on %s: %s, NVLink-complete %.1f%% (%s)", topology, who, float64(top.complete)/10, strings.Join(others, ", "))
	}
	return fmt.Sprintf("best on %s: %s, pair score %.1f (%s), NVLink-complete alike", topology, who, float64(top.pair)/10, strings.Join(others, ", "))
}
