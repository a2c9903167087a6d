package nvmlnode_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
)

// simInv is the inventory of a shipped simulated node, without a host tree.
func simInv(t *testing.T, name string) *node.Inventory {
	t.Helper()
	inv, err := nvmlnode.Discover(context.Background(), nvmlnode.WithNVML(newNode(t, name).NVML()))
	if err != nil {
		t.Fatal(err)
	}
	return inv
}

func allocOK(t *testing.T, a *allocator.Allocator, owner string, r allocator.Request) allocator.Allocation {
	t.Helper()
	al, err := a.Allocate(context.Background(), owner, r)
	if err != nil {
		t.Fatal(err)
	}
	return al
}

func TestMonitor(t *testing.T) {
	sim := newNode(t, "dgx1-volta")
	inv := simInv(t, "dgx1-volta")
	a, err := allocator.New(inv)
	if err != nil {
		t.Fatal(err)
	}
	allocOK(t, a, "job", allocator.Request{Devices: []string{"2", "3"}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events := make(chan nvmlnode.HealthEvent, 8)
	done := make(chan error, 1)
	go func() { done <- nvmlnode.Monitor(ctx, sim.NVML(), a, func(e nvmlnode.HealthEvent) { events <- e }) }()

	next := func() nvmlnode.HealthEvent {
		t.Helper()
		select {
		case e := <-events:
			return e
		case err := <-done:
			t.Fatalf("monitor stopped: %v", err)
		case <-time.After(10 * time.Second):
			t.Fatal("no health event")
		}
		return nvmlnode.HealthEvent{}
	}
	// The monitor registers its event set asynchronously: repeat the
	// application XIDs (reported, the GPU left healthy) until the
	// critical one after them is seen.
	deadline := time.Now().Add(10 * time.Second)
	var e nvmlnode.HealthEvent
	for got := false; !got; {
		if time.Now().After(deadline) {
			t.Fatal("monitor never saw an event")
		}
		for _, xid := range []uint64{13, 31, 43, 45, 68, 94} {
			if err := sim.InjectXID(2, xid); err != nil {
				t.Fatal(err)
			}
		}
		if err := sim.InjectXID(2, 48); err != nil {
			t.Fatal(err)
		}
		for timeout := time.After(200 * time.Millisecond); !got; {
			select {
			case e = <-events:
				if e.Verdict.State != node.StateUnhealthy {
					if !e.Device.Health.Healthy || len(e.Owners) != 0 {
						t.Fatalf("an application's XID acted on: %+v", e)
					}
					continue
				}
				got = true
			case <-timeout:
			}
			if !got {
				break
			}
		}
	}
	if e.Device.Index != 2 || e.XID != 48 || !slices.Equal(e.Owners, []string{"job"}) || e.Device.Health.Healthy || e.Err != nil {
		t.Fatalf("event %+v", e)
	}
	if a.Devices()[2].Health.Healthy {
		t.Fatal("GPU 2 not marked")
	}
	// Drain repeats of XID 48 from the registration loop.
	for len(events) > 0 {
		<-events
	}
	if err := sim.Lose(5); err != nil {
		t.Fatal(err)
	}
	for e = next(); e.Device.Index == 2 || e.Verdict.State != node.StateUnhealthy; e = next() {
	}
	if e.Device.Index != 5 || e.XID != 79 || len(e.Owners) != 0 {
		t.Fatalf("lost GPU event %+v", e)
	}
	// Placement goes on for the others.
	al := allocOK(t, a, "rest", allocator.Request{Count: 5})
	for _, d := range al.Devices {
		if d.Index == 2 || d.Index == 5 {
			t.Fatalf("unhealthy GPU %d handed out", d.Index)
		}
	}
	if err := sim.Restore(5); err != nil {
		t.Fatal(err)
	}
	if err := a.MarkHealthy(context.Background(), "5"); err != nil {
		t.Fatal(err)
	}
	if got := allocIndexes(allocOK(t, a, "back", allocator.Request{Count: 1})); !slices.Equal(got, []int{5}) {
		t.Fatalf("restored GPU not handed out: %v", got)
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("monitor returned %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("monitor ignores cancellation")
	}
}

func TestApplicationXID(t *testing.T) {
	for _, x := range []uint64{13, 31, 43, 45, 68, 109} {
		if !nvmlnode.ApplicationXID(x) {
			t.Errorf("XID %d not an application error", x)
		}
	}
	for _, x := range []uint64{48, 63, 64, 74, 79, 94, 95} {
		if nvmlnode.ApplicationXID(x) {
			t.Errorf("XID %d taken for an application error", x)
		}
	}
}

func TestMonitorArguments(t *testing.T) {
	a, err := allocator.New(simInv(t, "rtx8000x4"))
	if err != nil {
		t.Fatal(err)
	}
	lib := newNode(t, "rtx8000x4").NVML()
	for name, call := range map[string]func() error{
		"nil NVML":     func() error { return nvmlnode.Monitor(context.Background(), nil, a, func(nvmlnode.HealthEvent) {}) },
		"nil target":   func() error { return nvmlnode.Monitor(context.Background(), lib, nil, func(nvmlnode.HealthEvent) {}) },
		"nil callback": func() error { return nvmlnode.Monitor(context.Background(), lib, a, nil) },
	} {
		if err := call(); !errors.Is(err, node.ErrInvalid) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// fakeLostNVML answers as a sim whose GPU lost falls off the bus while
// watched: the event wait reports ERROR_GPU_IS_LOST without an event, and
// from then on the GPU answers ERROR_GPU_IS_LOST.
func fakeLostNVML(inv *node.Inventory, lost int) nvml.Interface {
	var mu sync.Mutex
	gone := false
	devs := make([]*mock.Device, len(inv.Devices))
	for i, d := range inv.Devices {
		devs[i] = &mock.Device{
			RegisterEventsFunc: func(uint64, nvml.EventSet) nvml.Return { return nvml.SUCCESS },
			GetUUIDFunc: func() (string, nvml.Return) {
				mu.Lock()
				defer mu.Unlock()
				if gone && i == lost {
					return "", nvml.ERROR_GPU_IS_LOST
				}
				return d.UUID, nvml.SUCCESS
			},
		}
	}
	set := &mock.EventSet{
		WaitFunc: func(ms uint32) (nvml.EventData, nvml.Return) {
			mu.Lock()
			defer mu.Unlock()
			if !gone {
				gone = true
				return nvml.EventData{}, nvml.ERROR_GPU_IS_LOST
			}
			time.Sleep(time.Duration(ms) * time.Millisecond)
			return nvml.EventData{}, nvml.ERROR_TIMEOUT
		},
		FreeFunc: func() nvml.Return { return nvml.SUCCESS },
	}
	return &mock.Interface{
		InitFunc:           func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc:       func() nvml.Return { return nvml.SUCCESS },
		EventSetCreateFunc: func() (nvml.EventSet, nvml.Return) { return set, nvml.SUCCESS },
		DeviceGetHandleByUUIDFunc: func(uuid string) (nvml.Device, nvml.Return) {
			for i, d := range inv.Devices {
				if d.UUID == uuid {
					return devs[i], nvml.SUCCESS
				}
			}
			return nil, nvml.ERROR_NOT_FOUND
		},
	}
}

// TestMonitorLostWhileWaiting: NVML's wait says a GPU is lost without
// naming it; the monitor finds which, marks it, tells its owner and goes on.
func TestMonitorLostWhileWaiting(t *testing.T) {
	inv := simInv(t, "dgx1-volta")
	a, err := allocator.New(inv)
	if err != nil {
		t.Fatal(err)
	}
	allocOK(t, a, "victim", allocator.Request{Devices: []string{"6", "7"}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events := make(chan nvmlnode.HealthEvent, 8)
	done := make(chan error, 1)
	go func() {
		done <- nvmlnode.Monitor(ctx, fakeLostNVML(inv, 6), a, func(e nvmlnode.HealthEvent) { events <- e })
	}()
	select {
	case e := <-events:
		if e.Device.Index != 6 || !slices.Equal(e.Owners, []string{"victim"}) || e.Device.Health.Healthy {
			t.Fatalf("event %+v", e)
		}
	case err := <-done:
		t.Fatalf("monitor stopped: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no event for the lost GPU")
	}
	select {
	case err := <-done:
		t.Fatalf("monitor stopped after a lost GPU: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	if !a.Devices()[7].Health.Healthy {
		t.Fatal("the other GPU was marked too")
	}
}

// TestMonitorLostGPUs: a GPU lost before the monitor starts is marked and
// its owner told; the others are still watched.
func TestMonitorLostGPUs(t *testing.T) {
	sim := newNode(t, "dgx1-volta")
	a := newAlloc(t, "dgx1-volta")
	allocOK(t, a, "victim", allocator.Request{Devices: []string{"4"}})
	if err := sim.Lose(4); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events := make(chan nvmlnode.HealthEvent, 64)
	done := make(chan error, 1)
	go func() { done <- nvmlnode.Monitor(ctx, sim.NVML(), a, func(e nvmlnode.HealthEvent) { events <- e }) }()
	select {
	case e := <-events:
		if e.Device.Index != 4 || !slices.Equal(e.Owners, []string{"victim"}) || !strings.HasPrefix(e.Device.Health.Reason, nvmlnode.ErrGPULost.Error()) {
			t.Fatalf("event %+v", e)
		}
	case err := <-done:
		t.Fatalf("monitor stopped: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no event for the lost GPU")
	}
	// The others are still watched.
	deadline := time.After(10 * time.Second)
	for seen := false; !seen; {
		if err := sim.InjectXID(1, 94); err != nil {
			t.Fatal(err)
		}
		select {
		case e := <-events:
			seen = e.Device.Index == 1 && e.XID == 94
		case err := <-done:
			t.Fatalf("monitor stopped: %v", err)
		case <-deadline:
			t.Fatal("monitor stopped watching")
		case <-time.After(200 * time.Millisecond):
		}
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}

func allocIndexes(al allocator.Allocation) []int {
	out := make([]int, len(al.Devices))
	for i, d := range al.Devices {
		out[i] = d.Index
	}
	return out
}

func newAlloc(t *testing.T, name string) *allocator.Allocator {
	t.Helper()
	a, err := allocator.New(simInv(t, name))
	if err != nil {
		t.Fatal(err)
	}
	return a
}
