package nvmlnode_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
)

// The health benchmarks measure, on a simulated node, how long the
// monitor takes from a fault injected to the allocator refusing the GPU,
// from the fault cleared to the GPU offered again, and, with WithReset,
// from a reset-needing fault on a held GPU (its holder released by the
// policy) to the GPU offered again. The health period is benchPeriod (the
// quiet period the same): recovery is bounded by it, as it is by
// --health-period on a node. Run them with
//
//	go test -run '^$' -bench Health -benchtime 20x ./node/nvmlnode/
//
// The "shared" variants inject through a host tree, as gpuinfo --inject
// does from another process (root).
const benchPeriod = 20 * time.Millisecond

// benchNode is a simulated node, sharing its faults through a host tree
// when shared, and an allocator over it.
func benchNode(b *testing.B, shared bool) (watched, injector *simnode.Node, a *allocator.Allocator) {
	b.Helper()
	mk := func() *simnode.Node {
		n, err := simnode.New("dgx1-volta")
		if err != nil {
			b.Fatal(err)
		}
		return n
	}
	watched, injector = mk(), mk()
	if shared {
		testenv.RequireRoot(b)
		dir := filepath.Join(b.TempDir(), "host")
		for _, n := range []*simnode.Node{watched, injector} {
			h, err := n.OpenHost(context.Background(), dir)
			if err == nil {
				err = n.ShareFaults(h)
			}
			if err != nil {
				b.Fatal(err)
			}
		}
	} else {
		injector = watched
	}
	inv, err := nvmlnode.Discover(context.Background(), nvmlnode.WithNVML(watched.NVML()))
	if err != nil {
		b.Fatal(err)
	}
	if a, err = allocator.New(inv); err != nil {
		b.Fatal(err)
	}
	return watched, injector, a
}

// benchMonitor runs a monitor of a over sim until the benchmark ends.
func benchMonitor(b *testing.B, sim *simnode.Node, a *allocator.Allocator, opts ...nvmlnode.MonitorOption) {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	opts = append([]nvmlnode.MonitorOption{nvmlnode.WithHealthPeriod(benchPeriod)}, opts...)
	go func() { done <- nvmlnode.Monitor(ctx, sim.NVML(), a, func(nvmlnode.HealthEvent) {}, opts...) }()
	b.Cleanup(func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			b.Errorf("monitor: %v", err)
		}
	})
}

// await waits until GPU i's health is healthy, failing after a minute.
func await(b *testing.B, a *allocator.Allocator, i int, healthy bool) {
	for deadline := time.Now().Add(time.Minute); a.Devices()[i].Health.Healthy != healthy; {
		if time.Now().After(deadline) {
			b.Fatalf("GPU %d: %s, want healthy %v", i, a.Devices()[i].Health, healthy)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

func BenchmarkHealthFaultToRefusal(b *testing.B) {
	for _, shared := range []bool{false, true} {
		b.Run(map[bool]string{false: "in-process", true: "shared"}[shared], func(b *testing.B) {
			watched, injector, a := benchNode(b, shared)
			benchMonitor(b, watched, a)
			time.Sleep(2 * benchPeriod) // the monitor's event set registered
			for b.Loop() {
				if err := injector.Inject(3, node.Signal{Kind: node.SignalXID, Value: 109}); err != nil {
					b.Fatal(err)
				}
				await(b, a, 3, false)
				b.StopTimer()
				if err := injector.Clear(3); err != nil {
					b.Fatal(err)
				}
				await(b, a, 3, true)
				b.StartTimer()
			}
			if _, err := a.Allocate(context.Background(), "x", allocator.Request{Devices: []string{"3"}}); err != nil {
				b.Fatal(err) // healthy again at the end
			}
		})
	}
}

func BenchmarkHealthRecoveryToOffered(b *testing.B) {
	for _, shared := range []bool{false, true} {
		b.Run(map[bool]string{false: "in-process", true: "shared"}[shared], func(b *testing.B) {
			watched, injector, a := benchNode(b, shared)
			benchMonitor(b, watched, a)
			for b.Loop() {
				b.StopTimer()
				if err := injector.Inject(3, node.Signal{Kind: node.SignalXID, Value: 109}); err != nil {
					b.Fatal(err)
				}
				await(b, a, 3, false)
				b.StartTimer()
				if err := injector.Clear(3); err != nil {
					b.Fatal(err)
				}
				await(b, a, 3, true)
			}
		})
	}
}

func BenchmarkHealthResetHeldToOffered(b *testing.B) {
	for _, shared := range []bool{false, true} {
		b.Run(map[bool]string{false: "in-process", true: "shared"}[shared], func(b *testing.B) {
			watched, injector, a := benchNode(b, shared)
			release := nvmlnode.ResetPolicyFunc(func(ctx context.Context, _ node.Device, owners []string) error {
				for _, o := range owners {
					if err := a.Release(ctx, o); err != nil {
						return err
					}
				}
				return nil
			})
			benchMonitor(b, watched, a, nvmlnode.WithReset(watched, release))
			for b.Loop() {
				b.StopTimer()
				if _, err := a.Allocate(context.Background(), "job", allocator.Request{Devices: []string{"3"}}); err != nil {
					b.Fatal(err)
				}
				before := injector.Resets(3)
				b.StartTimer()
				if err := injector.Inject(3, node.Signal{Kind: node.SignalXID, Value: 109}); err != nil {
					b.Fatal(err)
				}
				// The reset may be over before a look at the health:
				// wait for it, then for the GPU to be healthy.
				for deadline := time.Now().Add(time.Minute); injector.Resets(3) == before; {
					if time.Now().After(deadline) {
						b.Fatal("GPU 3 never reset")
					}
					time.Sleep(100 * time.Microsecond)
				}
				await(b, a, 3, true)
			}
			if n := injector.Resets(3); n < b.N {
				b.Fatalf("%d resets for %d faults", n, b.N)
			}
		})
	}
}
