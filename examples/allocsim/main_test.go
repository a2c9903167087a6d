package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/gpuiso/gpuiso/allocator"
)

// withoutLatency drops the two latency columns, the only ones that vary
// between runs of one seed.
func withoutLatency(out string) string {
	var b strings.Builder
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) > 2 && (f[0] == "topology" || f[0] == "pack" || f[0] == "spread") {
			f = f[:len(f)-2]
		}
		b.WriteString(strings.Join(f, " ") + "\n")
	}
	return b.String()
}

func TestRun(t *testing.T) {
	for _, topo := range []string{"dgx1-volta", "dgx2", "rtx8000x4"} {
		t.Run(topo, func(t *testing.T) {
			var out, errOut bytes.Buffer
			args := []string{"-topology", topo, "-jobs", "400", "-seed", "7"}
			if rc := run(context.Background(), args, &out, &errOut); rc != 0 {
				t.Fatalf("rc %d: %s", rc, errOut.String())
			}
			for _, want := range []string{"node " + topo, "accepted", "NVL k=2", "p99", "\nbest on " + topo + ": "} {
				if !strings.Contains(out.String(), want) {
					t.Fatalf("no %q in\n%s", want, out.String())
				}
			}
			for _, line := range strings.Split(out.String(), "\n") {
				if n := utf8.RuneCountInString(line); n > 100 {
					t.Errorf("line of %d columns, want at most 100: %q", n, line)
				}
			}
			rows := 0
			for _, line := range strings.Split(out.String(), "\n") {
				f := strings.Fields(line)
				if len(f) > 0 && (f[0] == "topology" || f[0] == "pack" || f[0] == "spread") {
					rows++
				}
			}
			if rows != 3 {
				t.Fatalf("%d policy rows in\n%s", rows, out.String())
			}
			var again bytes.Buffer
			run(context.Background(), args, &again, &errOut)
			if withoutLatency(out.String()) != withoutLatency(again.String()) {
				t.Fatalf("one seed, two results:\n%s\n%s", out.String(), again.String())
			}
		})
	}
}

func TestRunBadArguments(t *testing.T) {
	for _, args := range [][]string{{"-topology", "nope"}, {"-policies", "best"}, {"-jobs", "0"}, {"extra"}, {"-nosuchflag"},
		{"-jobs", "2000000000"}, {"-load", "NaN"}, {"-load", "+Inf"}, {"-load", "-1"}} {
		var out, errOut bytes.Buffer
		if rc := run(context.Background(), args, &out, &errOut); rc != 125 || bytes.Count(errOut.Bytes(), []byte("\n")) != 1 {
			t.Errorf("%v: rc %d, stderr %q", args, rc, errOut.String())
		}
	}
}

func TestRunCanceled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var out, errOut bytes.Buffer
	if rc := run(ctx, []string{"-jobs", "10"}, &out, &errOut); rc == 0 {
		t.Fatal("canceled run succeeded")
	}
}

func TestMaxClique(t *testing.T) {
	// 0-1-2 a triangle, 3 linked to 2 only.
	adj := []uint64{0b0110, 0b0101, 0b1011, 0b0100}
	for _, tt := range []struct {
		cand uint64
		want int
	}{{0b1111, 3}, {0b1011, 2}, {0b1001, 1}, {0, 0}} {
		if got := maxClique(adj, tt.cand); got != tt.want {
			t.Errorf("cand %04b: %d, want %d", tt.cand, got, tt.want)
		}
	}
}

func TestWorkload(t *testing.T) {
	jobs := workload(3, 1000, 4, 0.5)
	seen := map[int]bool{}
	for i, j := range jobs {
		if j.size > 4 || j.duration < 0 || i > 0 && j.arrive < jobs[i-1].arrive {
			t.Fatalf("job %d: %+v", i, j)
		}
		seen[j.size] = true
	}
	if !seen[1] || !seen[2] || !seen[4] || seen[8] {
		t.Fatalf("sizes %v", seen)
	}
}

// TestRunMIG: on a node with MIG devices the report adds the MIG workload,
// with the allocator's placement beside the spreading baseline, and the
// GPU workload runs on the whole GPUs alone.
func TestRunMIG(t *testing.T) {
	var out, errOut bytes.Buffer
	args := []string{"-topology", "dgx-a100-mig", "-jobs", "400", "-seed", "3"}
	if rc := run(context.Background(), args, &out, &errOut); rc != 0 {
		t.Fatalf("rc %d: %s", rc, errOut.String())
	}
	for _, want := range []string{"(4 whole GPUs)", "MIG workload: 400 jobs", "pack (allocator)", "spread (baseline)", "accepted by profile (allocator): 1g.5gb"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("no %q in\n%s", want, out.String())
		}
	}
	var plain bytes.Buffer
	if rc := run(context.Background(), []string{"-topology", "dgx-a100", "-jobs", "50"}, &plain, &errOut); rc != 0 || strings.Contains(plain.String(), "MIG workload") {
		t.Fatalf("rc %d, a MIG workload on a node without MIG devices:\n%s", rc, plain.String())
	}
}

// TestVerdict: the last line names the policy that did best and the
// criterion that decided, in the documented order.
func TestVerdict(t *testing.T) {
	mk := func(p allocator.Policy, accepted, complete2, asked2 int, pair float64) *result {
		return &result{policy: p, accepted: accepted, complete: map[int]int{2: complete2}, asked: map[int]int{2: asked2},
			pairScore: pair, scored: 1}
	}
	tests := []struct {
		name    string
		results []*result
		want    string
	}{
		{"more accepted wins", []*result{mk("topology", 100, 10, 10, 300), mk("pack", 90, 10, 10, 300)},
			"best on n: topology (most jobs accepted: 100; pack 90)"},
		{"then NVLink-complete", []*result{mk("topology", 100, 7, 10, 300), mk("pack", 100, 9, 10, 200)},
			"best on n: pack, NVLink-complete 90.0% (topology 70.0%)"},
		{"then pair score", []*result{mk("topology", 100, 9, 10, 300), mk("pack", 100, 9, 10, 200)},
			"best on n: topology, pair score 300.0 (pack 200.0), NVLink-complete alike"},
		{"ties named together", []*result{mk("topology", 100, 9, 10, 300), mk("pack", 100, 9, 10, 300), mk("spread", 100, 9, 10, 100)},
			"best on n: topology and pack, pair score 300.0 (spread 100.0), NVLink-complete alike"},
		{"all equal", []*result{mk("topology", 100, 9, 10, 300), mk("pack", 100, 9, 10, 300)},
			"on n the policies did equally well"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := verdict("n", tt.results); got != tt.want {
				t.Errorf("verdict = %q, want %q", got, tt.want)
			}
		})
	}
}
