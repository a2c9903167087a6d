package allocator_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/gpuiso/gpuiso/allocator"
)

func TestMarkUnhealthyHealthy(t *testing.T) {
	ctx := context.Background()
	a := newAlloc(t, "dgx1-volta")
	allocOK(t, a, "job", allocator.Request{Devices: []string{"2", "3"}})
	owners, err := a.MarkUnhealthy(ctx, "3", "XID 48")
	if err != nil || !slices.Equal(owners, []string{"job"}) {
		t.Fatalf("owners %v, err %v", owners, err)
	}
	if owners, err := a.MarkUnhealthy(ctx, "0", "test"); err != nil || len(owners) != 0 {
		t.Fatalf("free GPU: owners %v, err %v", owners, err)
	}
	if h := a.Devices()[3].Health; h.Healthy || h.Reason != "XID 48" {
		t.Fatalf("health %v", h)
	}
	// The owner keeps its GPU; it is not handed out after release.
	if err := a.Release(ctx, "job"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Allocate(ctx, "x", allocator.Request{Devices: []string{"3"}}); !errors.Is(err, allocator.ErrDeviceUnavailable) {
		t.Fatalf("unhealthy GPU handed out: %v", err)
	}
	if _, err := a.Allocate(ctx, "x", allocator.Request{Count: 7}); !errors.Is(err, allocator.ErrInsufficient) {
		t.Fatalf("7 of 6 healthy: %v", err)
	}
	if err := a.MarkHealthy(ctx, "3"); err != nil {
		t.Fatal(err)
	}
	if err := a.MarkHealthy(ctx, "GPU-none"); !errors.Is(err, allocator.ErrUnknownDevice) {
		t.Fatal(err)
	}
	allocOK(t, a, "x", allocator.Request{Count: 7})
}

func TestMonitor(t *testing.T) {
	node := newNode(t, "dgx1-volta")
	inv := simInv(t, "dgx1-volta")
	a, err := allocator.New(inv)
	if err != nil {
		t.Fatal(err)
	}
	allocOK(t, a, "job", allocator.Request{Devices: []string{"2", "3"}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events := make(chan allocator.HealthEvent, 8)
	done := make(chan error, 1)
	go func() { done <- a.Monitor(ctx, node.NVML(), func(e allocator.HealthEvent) { events <- e }) }()

	next := func() allocator.HealthEvent {
		t.Helper()
		select {
		case e := <-events:
			return e
		case err := <-done:
			t.Fatalf("monitor stopped: %v", err)
		case <-time.After(10 * time.Second):
			t.Fatal("no health event")
		}
		return allocator.HealthEvent{}
	}
	// The monitor registers its event set asynchronously: repeat the
	// application XID (ignored) until the critical one after it is seen.
	deadline := time.Now().Add(10 * time.Second)
	var e allocator.HealthEvent
	for got := false; !got; {
		if time.Now().After(deadline) {
			t.Fatal("monitor never saw an event")
		}
		for _, xid := range []uint64{13, 31, 43, 45, 68, 109} {
			if err := node.InjectXID(2, xid); err != nil {
				t.Fatal(err)
			}
		}
		if err := node.InjectXID(2, 48); err != nil {
			t.Fatal(err)
		}
		select {
		case e = <-events:
			got = true
		case <-time.After(200 * time.Millisecond):
		}
	}
	if e.Device.Index != 2 || e.XID != 48 || !slices.Equal(e.Owners, []string{"job"}) || e.Device.Health.Healthy || e.Err != nil {
		t.Fatalf("event %+v", e)
	}
	// Drain repeats of XID 48 from the registration loop.
	for len(events) > 0 {
		<-events
	}
	if err := node.Lose(5); err != nil {
		t.Fatal(err)
	}
	for e = next(); e.Device.Index == 2; e = next() {
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
	if err := node.Restore(5); err != nil {
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
		if !allocator.ApplicationXID(x) {
			t.Errorf("XID %d not an application error", x)
		}
	}
	for _, x := range []uint64{48, 63, 64, 74, 79, 94, 95} {
		if allocator.ApplicationXID(x) {
			t.Errorf("XID %d taken for an application error", x)
		}
	}
}

func TestMonitorArguments(t *testing.T) {
	a := newAlloc(t, "rtx8000x4")
	if err := a.Monitor(context.Background(), nil, func(allocator.HealthEvent) {}); !errors.Is(err, allocator.ErrInvalidRequest) {
		t.Fatal(err)
	}
}

// fakeLostNVML answers as a node whose GPU lost falls off the bus while
// watched: the event wait reports ERROR_GPU_IS_LOST without an event, and
// from then on the GPU answers ERROR_GPU_IS_LOST.
func fakeLostNVML(inv *allocator.Inventory, lost int) nvml.Interface {
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
	events := make(chan allocator.HealthEvent, 8)
	done := make(chan error, 1)
	go func() { done <- a.Monitor(ctx, fakeLostNVML(inv, 6), func(e allocator.HealthEvent) { events <- e }) }()
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
	node := newNode(t, "dgx1-volta")
	a := newAlloc(t, "dgx1-volta")
	allocOK(t, a, "victim", allocator.Request{Devices: []string{"4"}})
	if err := node.Lose(4); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events := make(chan allocator.HealthEvent, 64)
	done := make(chan error, 1)
	go func() { done <- a.Monitor(ctx, node.NVML(), func(e allocator.HealthEvent) { events <- e }) }()
	select {
	case e := <-events:
		if e.Device.Index != 4 || !slices.Equal(e.Owners, []string{"victim"}) || e.Device.Health.Reason != allocator.ErrGPULost.Error() {
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
		if err := node.InjectXID(1, 94); err != nil {
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
