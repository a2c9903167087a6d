package allocator_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/node"
)

// TestConcurrentRandomOperations runs 8 goroutines of 10,000 random
// operations each (allocate, allocate a memory share or a concurrent
// slice, resize, release, mark unhealthy and healthy) on one allocator and
// checks the invariants after every step: no GPU held twice, views
// agreeing, shares within memory and never beside an exclusive owner, one
// kind of share and one slice count per GPU, at most N slices of N, no
// unhealthy GPU handed out, failed operations changing nothing of the
// caller's.
func TestConcurrentRandomOperations(t *testing.T) {
	const workers, steps = 8, 10_000
	a := newAlloc(t, "dgx1-volta", allocator.WithShared("7"))
	mem := a.Devices()[7].MemoryBytes
	var health sync.RWMutex // health changes exclude allocations, so these can be checked
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- propertyWorker(a, &health, w, steps, mem)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}

func propertyWorker(a *allocator.Allocator, health *sync.RWMutex, w, steps int, mem uint64) error {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(uint64(w), 42))
	mine := map[string]int{} // owner -> GPUs held (0: a share)
	pick := func() string {
		for o := range mine {
			return o
		}
		return ""
	}
	for step := range steps {
		op := rng.IntN(10)
		switch {
		case op < 3:
			owner := fmt.Sprintf("w%d-%d", w, step)
			req := allocator.Request{Count: 1 + rng.IntN(4)}
			if op == 2 {
				req = allocator.Request{Share: &allocator.Share{MemoryBytes: 1 + rng.Uint64N(mem/2)}}
				if rng.IntN(2) == 0 {
					req = allocator.Request{Share: &allocator.Share{Mode: allocator.ShareSlice, Slices: 2 + rng.IntN(3)}}
				}
			}
			health.RLock()
			unhealthy := map[int]bool{}
			for _, d := range a.Devices() {
				if !d.Health.Healthy {
					unhealthy[d.Index] = true
				}
			}
			al, err := a.Allocate(ctx, owner, req)
			health.RUnlock()
			switch {
			case err == nil:
				for _, d := range al.Devices {
					if unhealthy[d.Index] {
						return fmt.Errorf("step %d: unhealthy gpu %d handed out", step, d.Index)
					}
				}
				shared := al.Share != nil && al.Share.Mode == allocator.ShareMemory
				sliced := al.Share != nil && al.Share.Mode == allocator.ShareSlice
				switch {
				case req.Share != nil && req.Share.Mode == allocator.ShareSlice:
					if !sliced || al.Share.Slices != req.Share.Slices || al.Share.MemoryBytes != mem/uint64(req.Share.Slices) {
						return fmt.Errorf("step %d: %+v for %+v", step, al, req)
					}
					shared = true
				case req.Share == nil && len(al.Devices) != req.Count || req.Share != nil && (!shared || al.Share.MemoryBytes != req.Share.MemoryBytes):
					return fmt.Errorf("step %d: %+v for %+v", step, al, req)
				}
				mine[owner] = len(al.Devices)
				if shared {
					mine[owner] = 0
				}
			case errors.Is(err, node.ErrInsufficient):
				if _, err := a.Allocation(owner); !errors.Is(err, allocator.ErrUnknownOwner) {
					return fmt.Errorf("step %d: failed allocation left %s holding GPUs", step, owner)
				}
			default:
				return fmt.Errorf("step %d: %w", step, err)
			}
		case op < 5:
			owner := pick()
			if owner == "" {
				continue
			}
			count := 1 + rng.IntN(4)
			al, err := a.Resize(ctx, owner, count)
			switch {
			case mine[owner] == 0:
				if !errors.Is(err, allocator.ErrInvalidRequest) {
					return fmt.Errorf("step %d: resize of a share: %v", step, err)
				}
			case err == nil:
				if len(al.Devices) != count {
					return fmt.Errorf("step %d: resized to %d, want %d", step, len(al.Devices), count)
				}
				mine[owner] = count
			case errors.Is(err, node.ErrInsufficient):
				now, err := a.Allocation(owner)
				if err != nil || len(now.Devices) != mine[owner] {
					return fmt.Errorf("step %d: failed resize changed %s: %v", step, owner, err)
				}
			default:
				return fmt.Errorf("step %d: %w", step, err)
			}
		case op < 8:
			owner := pick()
			if owner == "" {
				continue
			}
			if err := a.Release(ctx, owner); err != nil {
				return fmt.Errorf("step %d: %w", step, err)
			}
			delete(mine, owner)
		case op == 8:
			health.Lock()
			_, err := a.MarkUnhealthy(ctx, fmt.Sprint(rng.IntN(8)), "random")
			health.Unlock()
			if err != nil {
				return fmt.Errorf("step %d: %w", step, err)
			}
		default:
			health.Lock()
			err := a.MarkHealthy(ctx, fmt.Sprint(rng.IntN(8)))
			health.Unlock()
			if err != nil {
				return fmt.Errorf("step %d: %w", step, err)
			}
		}
		if err := allocator.CheckInvariants(a); err != nil {
			return fmt.Errorf("step %d: %w", step, err)
		}
	}
	return nil
}
