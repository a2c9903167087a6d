package dra_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/kubernetes/dra"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
)

// BenchmarkDevices16: computing the ResourceSlice's devices of a 16-GPU
// node (dgx2), which happens at start and on every health change.
func BenchmarkDevices16(b *testing.B) {
	_, inv := inventory(b, "dgx2")
	if len(inv.Devices) != 16 {
		b.Fatalf("%d GPUs", len(inv.Devices))
	}
	for b.Loop() {
		if len(dra.Devices(inv, inv.Devices, dra.SliceOptions{})) != 16 {
			b.Fatal("devices")
		}
	}
}

// BenchmarkPrepare20 prepares 20 claims of one GPU each at once, as the
// kubelet does when 20 pods with claims start together on a node (a
// simulated node of 20 PCIe GPUs), then unprepares them. It reports the latency of one claim's prepare as the kubelet sees
// it (its wait for the others included) over every claim of every
// iteration: p50 and p99 in milliseconds, and the mean of each step
// (dra.Event.Steps). The state and CDI directories are on the test's
// temporary directory's file system (their syncs are part of the cost).
func BenchmarkPrepare20(b *testing.B) {
	const n = 20
	inv := largeNode(b, n)
	dir := b.TempDir()
	allocDir, cdiDir := filepath.Join(dir, "alloc"), filepath.Join(dir, "cdi")
	for _, d := range []string{allocDir, cdiDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			b.Fatal(err)
		}
	}
	a, err := allocator.New(inv, allocator.WithStateDir(allocDir))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { a.Close() })
	var mu sync.Mutex
	var took []time.Duration
	steps := map[string]time.Duration{}
	obs := dra.ObserverFunc(func(ev dra.Event) {
		if ev.Op != dra.OpPrepare {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		took = append(took, ev.Took)
		for _, s := range ev.Steps {
			steps[s.Name] += s.Took
		}
	})
	d, err := dra.New(inv, a, dra.Config{CDIDir: cdiDir, StateDir: filepath.Join(dir, "claims"), Observer: obs})
	if err != nil {
		b.Fatal(err)
	}
	var names []string
	for _, dev := range dra.Devices(inv, a.Devices(), dra.SliceOptions{}) {
		names = append(names, dev.Name)
	}
	if len(names) < n {
		b.Fatalf("%d devices, want %d", len(names), n)
	}
	ctx := context.Background()
	round := 0
	for b.Loop() {
		round++
		var wg sync.WaitGroup
		errs := make([]error, n)
		for i := range n {
			wg.Go(func() {
				_, errs[i] = d.Prepare(ctx, claim(fmt.Sprintf("b%d-%d", round, i), names[i]))
			})
		}
		wg.Wait()
		for i := range n {
			if errs[i] != nil {
				b.Fatal(errs[i])
			}
			wg.Go(func() {
				errs[i] = d.Unprepare(ctx, fmt.Sprintf("b%d-%d", round, i))
			})
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				b.Fatal(err)
			}
		}
	}
	slices.Sort(took)
	ms := func(q float64) float64 {
		return float64(took[min(len(took)-1, int(q*float64(len(took))))]) / float64(time.Millisecond)
	}
	b.ReportMetric(ms(0.50), "p50-ms")
	b.ReportMetric(ms(0.99), "p99-ms")
	for name, sum := range steps {
		b.ReportMetric(float64(sum)/float64(len(took))/float64(time.Millisecond), name+"-ms")
	}
}

// largeNode is a simulated node of n PCIe GPUs (pcie8's model and
// layout, repeated), with its host tree.
func largeNode(b *testing.B, n int) *node.Inventory {
	testenv.RequireRoot(b)
	base, err := simnode.New("pcie8")
	if err != nil {
		b.Fatal(err)
	}
	spec := base.Spec()
	spec.Name, spec.NVLinks = fmt.Sprintf("pcie%d", n), nil
	model := spec.GPUs[0]
	spec.GPUs = nil
	for i := range n {
		g := model
		g.BusID = fmt.Sprintf("0000:%02x:00.0", 0x10+i)
		g.NUMANode, g.HostBridge, g.Switches = i%2, i/4, []int{i / 2}
		spec.GPUs = append(spec.GPUs, g)
	}
	sim, err := simnode.NewFromSpec(spec)
	if err != nil {
		b.Fatal(err)
	}
	host, err := sim.MakeHost(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { host.Remove() })
	inv, err := nvmlnode.Discover(context.Background(), sim.DiscoverOptions(host)...)
	if err != nil {
		b.Fatal(err)
	}
	return inv
}
