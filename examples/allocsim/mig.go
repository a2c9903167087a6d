package main

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/node"
)

// migJob is one arrival of the MIG workload: a MIG device of a profile, one
// of at least some memory, or whole GPUs.
type migJob struct {
	arrive, duration float64
	profile          string // a MIG profile, or ""
	memory           uint64 // a minimum MIG memory, or 0
	gpus             int    // whole GPUs, or 0
}

// migWorkload draws n jobs for a node with MIG devices: 70% MIG jobs (four
// in five by profile, drawn as the layout offers them, one in five by a
// minimum memory), 30% jobs of 1 or 2 whole GPUs when the node has whole
// GPUs. Durations make the offered load load times the node's capacity.
func migWorkload(seed uint64, n int, inv *node.Inventory, load float64) []migJob {
	rng := rand.New(rand.NewPCG(seed, 0x6a09e667f3bcc908))
	var profiles []string
	var memories []uint64
	whole := 0
	for _, d := range inv.Devices {
		if !d.MIGSplit() {
			whole++
		}
		for _, m := range d.MIGDevices {
			profiles = append(profiles, m.Profile)
			memories = append(memories, m.MemoryBytes)
		}
	}
	units := len(profiles)
	mean := 0.7*1 + 0.3*1.5*float64(min(whole, 1))
	meanDuration := load * float64(units+whole) / mean
	jobs := make([]migJob, n)
	t := 0.0
	for i := range jobs {
		t += rng.ExpFloat64()
		j := migJob{arrive: t, duration: rng.ExpFloat64() * meanDuration}
		switch x := rng.Float64(); {
		case x >= 0.7 && whole > 0:
			j.gpus = 1 + rng.IntN(min(whole, 2))
		case x < 0.14:
			j.memory = memories[rng.IntN(len(memories))] - 1<<20
		default:
			j.profile = profiles[rng.IntN(len(profiles))]
		}
		jobs[i] = j
	}
	return jobs
}

// migResult is one MIG placement's tally.
type migResult struct {
	name                     string
	migOK, migNo             int
	wholeOK, wholeNo         int
	untouched                float64 // sum over arrivals of the share of MIG parents with nothing held
	arrivals                 int
	wasted                   uint64 // sum over memory jobs of memory granted beyond the minimum
	memoryJobs               int
	latency                  []time.Duration
	perProfileOK, perProfile map[string]int
}

// simulateMIG replays jobs with the allocator's MIG placement, or with a
// spreading baseline that names the device itself: the free match on the
// parent with the fewest devices held.
func simulateMIG(ctx context.Context, inv *node.Inventory, jobs []migJob, spread bool) (*migResult, error) {
	a, err := allocator.New(inv)
	if err != nil {
		return nil, err
	}
	res := &migResult{name: "pack (allocator)", perProfileOK: map[string]int{}, perProfile: map[string]int{}}
	if spread {
		res.name = "spread (baseline)"
	}
	var parents []int
	for p, d := range inv.Devices {
		if d.MIGSplit() {
			parents = append(parents, p)
		}
	}
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
		held := heldPerParent(a)
		if len(parents) > 0 {
			n := 0
			for _, p := range parents {
				if held[p] == 0 {
					n++
				}
			}
			res.untouched += float64(n) / float64(len(parents))
			res.arrivals++
		}
		req := allocator.Request{MIG: jb.profile, MIGMemoryBytes: jb.memory, Count: jb.gpus}
		if spread && jb.gpus == 0 {
			if uuid := spreadPick(a, held, jb); uuid != "" {
				req = allocator.Request{Devices: []string{uuid}}
			}
		}
		owner := fmt.Sprintf("job-%d", i)
		start := time.Now()
		al, err := a.Allocate(ctx, owner, req)
		res.latency = append(res.latency, time.Since(start))
		ok := err == nil
		if err != nil && !errors.Is(err, node.ErrInsufficient) {
			return nil, err
		}
		switch {
		case jb.gpus > 0 && ok:
			res.wholeOK++
		case jb.gpus > 0:
			res.wholeNo++
		case ok:
			res.migOK++
		default:
			res.migNo++
		}
		if jb.profile != "" {
			res.perProfile[jb.profile]++
			if ok {
				res.perProfileOK[jb.profile]++
			}
		}
		if ok && jb.memory > 0 {
			res.wasted += al.Devices[0].MIG.MemoryBytes - jb.memory
			res.memoryJobs++
		}
		if ok {
			heap.Push(&pending, departure{at: jb.arrive + jb.duration, owner: owner})
		}
	}
	return res, nil
}

// heldPerParent counts the MIG devices held on each parent position.
func heldPerParent(a *allocator.Allocator) map[int]int {
	free := map[string]bool{}
	for _, m := range a.FreeMIG() {
		free[m.UUID] = true
	}
	held := map[int]int{}
	for p, d := range a.Devices() {
		for _, m := range d.MIGDevices {
			if !free[m.UUID] {
				held[p]++
			}
		}
	}
	return held
}

// spreadPick is the baseline's choice: the first free device that fits, on
// the parent with the fewest devices held; "" when none fits.
func spreadPick(a *allocator.Allocator, held map[int]int, jb migJob) string {
	best, bestHeld := "", 0
	for _, m := range a.FreeMIG() {
		fits := (jb.profile != "" && m.Profile == jb.profile) || (jb.memory > 0 && m.MemoryBytes >= jb.memory)
		if fits && (best == "" || held[m.Parent] < bestHeld) {
			best, bestHeld = m.UUID, held[m.Parent]
		}
	}
	return best
}

func reportMIG(w io.Writer, jobs int, load float64, results []*migResult) {
	fmt.Fprintf(w, "\nMIG workload: %d jobs (70%% MIG devices, by profile or by minimum memory;\n30%% 1-2 whole GPUs), offered load %.2f\n\n", jobs, load)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "MIG placement\tMIG ok\tMIG no\twhole ok\twhole no\tuntouched\tmemory over\tp50\tp99\t")
	for _, r := range results {
		over := "-"
		if r.memoryJobs > 0 {
			over = fmt.Sprintf("%d MiB", r.wasted/uint64(r.memoryJobs)>>20)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%.3f\t%s\t%s\t%s\t\n", r.name, r.migOK, r.migNo, r.wholeOK, r.wholeNo,
			r.untouched/float64(max(r.arrivals, 1)), over,
			percentile(r.latency, 0.50).Round(100*time.Nanosecond), percentile(r.latency, 0.99).Round(100*time.Nanosecond))
	}
	tw.Flush()
	if len(results) > 0 {
		var names []string
		for p := range results[0].perProfile {
			names = append(names, p)
		}
		sort.Strings(names)
		line := "\naccepted by profile (allocator):"
		for _, p := range names {
			item := fmt.Sprintf(" %s %d/%d", p, results[0].perProfileOK[p], results[0].perProfile[p])
			if len(line)+len(item) > 100 {
				fmt.Fprintln(w, line)
				line = " "
			}
			line += item
		}
		fmt.Fprintln(w, line)
	}
	fmt.Fprintln(w, "ok, no: jobs accepted, rejected (MIG device jobs; whole-GPU jobs)")
	fmt.Fprintln(w, "untouched: mean share of MIG-enabled GPUs none of whose MIG devices is held, at each arrival")
	fmt.Fprintln(w, "memory over: mean memory a by-memory MIG job got beyond the minimum it asked for")
	if len(results) == 2 {
		fmt.Fprintln(w, "\n"+migVerdict(results[0], results[1]))
	}
}

// hasMIG tells whether the node has MIG devices to hand out.
func hasMIG(inv *node.Inventory) bool {
	return slices.ContainsFunc(inv.Devices, func(d node.Device) bool { return len(d.MIGDevices) > 0 })
}

// migVerdict is one line saying which MIG placement did better and why: more
// jobs accepted, then more parents left untouched (room for large profiles).
func migVerdict(a, b *migResult) string {
	okA, okB := a.migOK+a.wholeOK, b.migOK+b.wholeOK
	untA, untB := a.untouched/float64(max(a.arrivals, 1)), b.untouched/float64(max(b.arrivals, 1))
	switch {
	case okA != okB:
		best, other, n, m := a, b, okA, okB
		if okB > okA {
			best, other, n, m = b, a, okB, okA
		}
		return fmt.Sprintf("best MIG placement: %s (most jobs accepted: %d; %s %d)", best.name, n, other.name, m)
	case untA != untB:
		best, other, x, y := a, b, untA, untB
		if untB > untA {
			best, other, x, y = b, a, untB, untA
		}
		return fmt.Sprintf("best MIG placement: %s (as many jobs; more parents untouched: %.3f; %s %.3f)", best.name, x, other.name, y)
	}
	return fmt.Sprintf("MIG placements %s and %s did equally well", a.name, b.name)
}
