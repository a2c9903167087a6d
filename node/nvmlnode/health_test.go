package nvmlnode_test

import (
	"context"
	"encoding/binary"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
)

// signals is what a fake GPU answers to the polled health calls.
type signals struct {
	mu          sync.Mutex
	recovery    uint64
	noRecovery  bool // the driver gives no recovery action
	rowsPending bool
	rowsFailed  bool
	pages       bool
	linksUp     []int
	linkErrors  uint64
	replays     int
	clocks      uint64
	lost        bool
	reads       int // polls seen
}

func (s *signals) set(f func(*signals)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(s)
}

// device is a fake GPU answering from s.
func (s *signals) device() *mock.Device {
	lock := func() func() { s.mu.Lock(); return s.mu.Unlock }
	return &mock.Device{
		GetFieldValuesFunc: func(fv []nvml.FieldValue) nvml.Return {
			defer lock()()
			switch {
			case s.lost:
				return nvml.ERROR_GPU_IS_LOST
			case s.noRecovery:
				return nvml.ERROR_NOT_SUPPORTED
			}
			fv[0].ValueType = uint32(nvml.VALUE_TYPE_UNSIGNED_INT)
			binary.NativeEndian.PutUint32(fv[0].Value[:4], uint32(s.recovery))
			return nvml.SUCCESS
		},
		GetRemappedRowsFunc: func() (int, int, bool, bool, nvml.Return) {
			defer lock()()
			s.reads++
			return 0, 0, s.rowsPending, s.rowsFailed, nvml.SUCCESS
		},
		GetRetiredPagesPendingStatusFunc: func() (nvml.EnableState, nvml.Return) {
			defer lock()()
			if s.pages {
				return nvml.FEATURE_ENABLED, nvml.SUCCESS
			}
			return nvml.FEATURE_DISABLED, nvml.SUCCESS
		},
		GetNvLinkStateFunc: func(link int) (nvml.EnableState, nvml.Return) {
			defer lock()()
			if link >= 4 {
				return 0, nvml.ERROR_INVALID_ARGUMENT
			}
			if slices.Contains(s.linksUp, link) {
				return nvml.FEATURE_ENABLED, nvml.SUCCESS
			}
			return nvml.FEATURE_DISABLED, nvml.SUCCESS
		},
		GetNvLinkErrorCounterFunc: func(link int, c nvml.NvLinkErrorCounter) (uint64, nvml.Return) {
			defer lock()()
			if link == 0 && c == nvml.NVLINK_ERROR_DL_CRC_FLIT {
				return s.linkErrors, nvml.SUCCESS
			}
			return 0, nvml.SUCCESS
		},
		GetPcieReplayCounterFunc: func() (int, nvml.Return) {
			defer lock()()
			return s.replays, nvml.SUCCESS
		},
		GetCurrentClocksEventReasonsFunc: func() (uint64, nvml.Return) {
			defer lock()()
			return s.clocks, nvml.SUCCESS
		},
	}
}

func TestReadHealth(t *testing.T) {
	tests := []struct {
		name string
		set  func(*signals)
		want []node.Signal
	}{
		{"nothing", func(*signals) {}, nil},
		{"recovery action reset", func(s *signals) { s.recovery = node.RecoveryGPUReset }, []node.Signal{{Kind: node.SignalRecoveryAction, Value: node.RecoveryGPUReset}}},
		{"rows pending", func(s *signals) { s.rowsPending = true }, []node.Signal{{Kind: node.SignalRowRemapPending}}},
		{"rows failed", func(s *signals) { s.rowsFailed = true }, []node.Signal{{Kind: node.SignalRowRemapFailed}}},
		{"pages pending", func(s *signals) { s.pages = true }, []node.Signal{{Kind: node.SignalRetiredPagesPending}}},
		{"thermal", func(s *signals) { s.clocks = 0x40 }, []node.Signal{{Kind: node.SignalThermalSlowdown}}},
		{"power brake", func(s *signals) { s.clocks = 0x80 }, []node.Signal{{Kind: node.SignalPowerSlowdown}}},
		{"power cap is work, not a fault", func(s *signals) { s.clocks = 0x4 }, nil},
		{"lost", func(s *signals) { s.lost = true; s.rowsPending = true }, []node.Signal{{Kind: node.SignalLost}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &signals{}
			tt.set(s)
			r := nvmlnode.ReadHealth(s.device())
			if !slices.Equal(r.Conditions, tt.want) {
				t.Errorf("conditions %v, want %v", r.Conditions, tt.want)
			}
			if r.Lost != s.lost || (!s.lost && !r.RecoveryKnown) {
				t.Errorf("lost %v, recovery known %v", r.Lost, r.RecoveryKnown)
			}
		})
	}
	s := &signals{linksUp: []int{0, 1, 3}, linkErrors: 7, replays: 2}
	r := nvmlnode.ReadHealth(s.device())
	if !slices.Equal(r.LinksUp, []int{0, 1, 3}) || r.NVLinkErrors != 7 || r.PCIeReplays != 2 {
		t.Errorf("reading %+v", r)
	}
	// A device that answers nothing (a test double without the calls)
	// gives an empty reading, not a panic.
	if r := nvmlnode.ReadHealth(&mock.Device{}); len(r.Conditions) != 0 || r.RecoveryKnown || r.Lost {
		t.Errorf("reading of a silent device %+v", r)
	}
}

// fakeNVML is a node of one GPU per signals, with an event set that
// delivers what is queued on events.
func fakeNVML(inv *node.Inventory, gpus []*signals, events chan nvml.EventData) (nvml.Interface, []*mock.Device) {
	devs := make([]*mock.Device, len(inv.Devices))
	for i, d := range inv.Devices {
		devs[i] = gpus[i].device()
		devs[i].RegisterEventsFunc = func(uint64, nvml.EventSet) nvml.Return { return nvml.SUCCESS }
		devs[i].GetUUIDFunc = func() (string, nvml.Return) { return d.UUID, nvml.SUCCESS }
	}
	set := &mock.EventSet{
		WaitFunc: func(ms uint32) (nvml.EventData, nvml.Return) {
			select {
			case e := <-events:
				return e, nvml.SUCCESS
			case <-time.After(time.Duration(ms) * time.Millisecond):
				return nvml.EventData{}, nvml.ERROR_TIMEOUT
			}
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
	}, devs
}

// watchHealth runs a monitor of a over lib with a short period until the
// test ends; its events come on the channel returned.
func watchHealth(t *testing.T, lib nvml.Interface, a *allocator.Allocator, opts ...nvmlnode.MonitorOption) <-chan nvmlnode.HealthEvent {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	events := make(chan nvmlnode.HealthEvent, 256)
	done := make(chan error, 1)
	opts = append([]nvmlnode.MonitorOption{nvmlnode.WithHealthPeriod(20 * time.Millisecond)}, opts...)
	go func() { done <- nvmlnode.Monitor(ctx, lib, a, func(e nvmlnode.HealthEvent) { events <- e }, opts...) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("monitor: %v", err)
		}
	})
	return events
}

// awaitEvent returns the first event that ok accepts, failing the test
// after a deadline.
func awaitEvent(t *testing.T, events <-chan nvmlnode.HealthEvent, ok func(nvmlnode.HealthEvent) bool) nvmlnode.HealthEvent {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case e := <-events:
			if ok(e) {
				return e
			}
		case <-deadline:
			t.Fatal("no such health event")
			return nvmlnode.HealthEvent{}
		}
	}
}

// awaitHealth waits until GPU i of a is healthy (or not), failing the test
// after a deadline.
func awaitHealth(t *testing.T, a *allocator.Allocator, i int, healthy bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); a.Devices()[i].Health.Healthy != healthy; {
		if time.Now().After(deadline) {
			t.Fatalf("GPU %d: %s, want healthy %v", i, a.Devices()[i].Health, healthy)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestMonitorPolledSignals: each polled signal that the table makes
// unhealthy marks the GPU; once it clears (and the driver's recovery
// action is none) the GPU is healthy again on its own. Informing signals
// are told, once while they hold, and change nothing.
func TestMonitorPolledSignals(t *testing.T) {
	tests := []struct {
		name  string
		fault func(*signals)
		heal  func(*signals)
		kind  node.SignalKind
	}{
		{"recovery action", func(s *signals) { s.recovery = node.RecoveryGPUReset }, func(s *signals) { s.recovery = node.RecoveryNone }, node.SignalRecoveryAction},
		{"rows pending", func(s *signals) { s.rowsPending = true }, func(s *signals) { s.rowsPending = false }, node.SignalRowRemapPending},
		{"rows failed", func(s *signals) { s.rowsFailed = true }, func(s *signals) { s.rowsFailed = false }, node.SignalRowRemapFailed},
		{"pages pending", func(s *signals) { s.pages = true }, func(s *signals) { s.pages = false }, node.SignalRetiredPagesPending},
		{"NVLink down", func(s *signals) { s.linksUp = []int{0} }, func(s *signals) { s.linksUp = []int{0, 1} }, node.SignalNVLinkDown},
		{"lost", func(s *signals) { s.lost = true }, func(s *signals) { s.lost = false }, node.SignalLost},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			inv := simInv(t, "rtx8000x4")
			gpus := []*signals{{linksUp: []int{0, 1}}, {}, {}, {}}
			lib, _ := fakeNVML(inv, gpus, make(chan nvml.EventData))
			a, err := allocator.New(inv)
			if err != nil {
				t.Fatal(err)
			}
			events := watchHealth(t, lib, a)
			// The first reading is taken before the fault (NVLinks are
			// compared with it).
			awaitPolls(t, gpus[0])
			gpus[0].set(tt.fault)
			e := awaitEvent(t, events, func(e nvmlnode.HealthEvent) bool { return e.Verdict.State == node.StateUnhealthy })
			if e.Device.Index != 0 || e.Verdict.Signal.Kind != tt.kind || e.Err != nil {
				t.Fatalf("event %+v", e)
			}
			awaitHealth(t, a, 0, false)
			gpus[0].set(tt.heal)
			e = awaitEvent(t, events, func(e nvmlnode.HealthEvent) bool { return e.Healed })
			if e.Device.Index != 0 || !e.Device.Health.Healthy || e.Err != nil {
				t.Fatalf("healed event %+v", e)
			}
			awaitHealth(t, a, 0, true)
		})
	}
}

// awaitPolls waits until the monitor has read s twice more (a whole
// period has passed), failing the test after a deadline.
func awaitPolls(t *testing.T, s *signals) {
	t.Helper()
	s.mu.Lock()
	want := s.reads + 2
	s.mu.Unlock()
	for deadline := time.Now().Add(10 * time.Second); ; {
		s.mu.Lock()
		n := s.reads
		s.mu.Unlock()
		if n >= want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the monitor does not poll")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestMonitorInform: an informing signal is told once while it holds and
// the GPU stays in service; counters that rise are told each time.
func TestMonitorInform(t *testing.T) {
	inv := simInv(t, "rtx8000x4")
	gpus := []*signals{{}, {}, {}, {}}
	lib, _ := fakeNVML(inv, gpus, make(chan nvml.EventData))
	a, err := allocator.New(inv)
	if err != nil {
		t.Fatal(err)
	}
	events := watchHealth(t, lib, a)
	gpus[1].set(func(s *signals) { s.clocks = 0x40 })
	e := awaitEvent(t, events, func(e nvmlnode.HealthEvent) bool { return e.Device.Index == 1 })
	if e.Verdict.Signal.Kind != node.SignalThermalSlowdown || e.Verdict.State != node.StateInform || !e.Device.Health.Healthy {
		t.Fatalf("event %+v", e)
	}
	gpus[1].set(func(s *signals) { s.replays = 3 })
	e = awaitEvent(t, events, func(e nvmlnode.HealthEvent) bool { return e.Device.Index == 1 })
	if e.Verdict.Signal != (node.Signal{Kind: node.SignalPCIeReplay, Value: 3}) || e.Verdict.State != node.StateInform {
		t.Fatalf("event %+v: want the slowdown told once, then 3 replays", e)
	}
	// The replays' note goes after the quiet period; the slowdown's,
	// which still holds, comes back.
	for deadline := time.Now().Add(10 * time.Second); !strings.HasPrefix(a.Devices()[1].Health.Reason, "thermal-slowdown"); {
		if h := a.Devices()[1].Health; time.Now().After(deadline) || !h.Healthy {
			t.Fatalf("GPU 1 while hot: %+v, want healthy with the slowdown noted", h)
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Cool again: the note goes after the quiet period.
	gpus[1].set(func(s *signals) { s.clocks = 0 })
	for deadline := time.Now().Add(10 * time.Second); a.Devices()[1].Health != node.Healthy(); {
		if time.Now().After(deadline) {
			t.Fatalf("GPU 1 cool: %+v, want the note gone", a.Devices()[1].Health)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestMonitorXIDTable: XIDs go by the health table: 94 (restart the
// application) informs, 109 (reset the GPU) marks; an operator's rule
// overrides the default.
func TestMonitorXIDTable(t *testing.T) {
	inv := simInv(t, "rtx8000x4")
	gpus := []*signals{{}, {}, {}, {}}
	queue := make(chan nvml.EventData, 8)
	lib, devs := fakeNVML(inv, gpus, queue)
	a, err := allocator.New(inv)
	if err != nil {
		t.Fatal(err)
	}
	override, err := node.ParseHealthRules("xid 31 unhealthy drain page faults taken seriously")
	if err != nil {
		t.Fatal(err)
	}
	events := watchHealth(t, lib, a, nvmlnode.WithHealthTable(append(node.DefaultHealthTable(), override...)))
	xid := func(i int, x uint64) {
		queue <- nvml.EventData{Device: devs[i], EventType: nvml.EventTypeXidCriticalError, EventData: x, GpuInstanceId: 0xFFFFFFFF, ComputeInstanceId: 0xFFFFFFFF}
	}
	xid(0, 94)
	e := awaitEvent(t, events, func(e nvmlnode.HealthEvent) bool { return e.XID != 0 })
	if e.XID != 94 || e.Verdict.State != node.StateInform || e.Verdict.Action != node.ActionRestartApp || !e.Device.Health.Healthy || !a.Devices()[0].Health.Healthy {
		t.Fatalf("XID 94: %+v", e)
	}
	xid(1, 109)
	e = awaitEvent(t, events, func(e nvmlnode.HealthEvent) bool { return e.XID != 0 })
	if e.XID != 109 || e.Verdict.Action != node.ActionResetGPU || a.Devices()[1].Health.Healthy {
		t.Fatalf("XID 109: %+v", e)
	}
	xid(2, 31)
	e = awaitEvent(t, events, func(e nvmlnode.HealthEvent) bool { return e.XID != 0 })
	if e.XID != 31 || e.Verdict.Action != node.ActionDrain || a.Devices()[2].Health.Healthy {
		t.Fatalf("XID 31 overridden: %+v", e)
	}
}

// TestMonitorResetNeedsDriver: a GPU marked for a fault that needs a reset
// is healthy again only when the driver says no action is needed; on a
// driver without a recovery action it stays unhealthy.
func TestMonitorResetNeedsDriver(t *testing.T) {
	inv := simInv(t, "rtx8000x4")
	gpus := []*signals{{noRecovery: true}, {}, {}, {}}
	queue := make(chan nvml.EventData, 8)
	lib, devs := fakeNVML(inv, gpus, queue)
	a, err := allocator.New(inv)
	if err != nil {
		t.Fatal(err)
	}
	events := watchHealth(t, lib, a, nvmlnode.WithQuietPeriod(0))
	for _, i := range []int{0, 1} {
		queue <- nvml.EventData{Device: devs[i], EventType: nvml.EventTypeXidCriticalError, EventData: 79, GpuInstanceId: 0xFFFFFFFF, ComputeInstanceId: 0xFFFFFFFF}
	}
	// GPU 1's driver says no action is needed: it heals; GPU 0's says
	// nothing: it stays.
	e := awaitEvent(t, events, func(e nvmlnode.HealthEvent) bool { return e.Healed })
	if e.Device.Index != 1 {
		t.Fatalf("healed %+v", e)
	}
	if a.Devices()[0].Health.Healthy {
		t.Fatal("a GPU that needs a reset healed on a driver that does not say")
	}
	// An operator's reason is never healed.
	if _, err := a.MarkUnhealthy(context.Background(), "2", "maintenance"); err != nil {
		t.Fatal(err)
	}
	awaitPolls(t, gpus[2])
	awaitPolls(t, gpus[2])
	if a.Devices()[2].Health.Healthy {
		t.Fatal("the monitor healed an operator's mark")
	}
}

func TestMonitorOptions(t *testing.T) {
	a, err := allocator.New(simInv(t, "rtx8000x4"))
	if err != nil {
		t.Fatal(err)
	}
	lib := newNode(t, "rtx8000x4").NVML()
	for name, opt := range map[string]nvmlnode.MonitorOption{
		"nil":             nil,
		"zero period":     nvmlnode.WithHealthPeriod(0),
		"negative quiet":  nvmlnode.WithQuietPeriod(-time.Second),
		"no table":        nvmlnode.WithHealthTable(nil),
		"a table missing": nvmlnode.WithHealthTable(node.DefaultHealthTable()[:3]),
	} {
		err := nvmlnode.Monitor(context.Background(), lib, a, func(nvmlnode.HealthEvent) {}, opt)
		if !errors.Is(err, node.ErrInvalid) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestMonitorHealsSimulated: on a simulated node whose faults live in a
// host tree, XID 79 injected by another node over the tree (as gpuinfo
// --inject does from another process) marks the GPU unhealthy; clear
// makes it healthy again on its own, without MarkHealthy from anyone.
func TestMonitorHealsSimulated(t *testing.T) {
	testenv.RequireRoot(t)
	dir := filepath.Join(t.TempDir(), "host")
	shared := func() *simnode.Node {
		sim := newNode(t, "dgx1-volta")
		h, err := sim.OpenHost(context.Background(), dir)
		if err != nil {
			t.Fatal(err)
		}
		if err := sim.ShareFaults(h); err != nil {
			t.Fatal(err)
		}
		return sim
	}
	watched, injector := shared(), shared()
	a, err := allocator.New(discoverSim(t, watched.NVML()))
	if err != nil {
		t.Fatal(err)
	}
	allocOK(t, a, "job", allocator.Request{Devices: []string{"3"}})
	events := watchHealth(t, watched.NVML(), a, nvmlnode.WithHealthPeriod(50*time.Millisecond))
	if err := injector.Inject(3, node.Signal{Kind: node.SignalXID, Value: 79}); err != nil {
		t.Fatal(err)
	}
	e := awaitEvent(t, events, func(e nvmlnode.HealthEvent) bool { return e.Verdict.State == node.StateUnhealthy })
	if e.Device.Index != 3 || !slices.Equal(e.Owners, []string{"job"}) {
		t.Fatalf("event %+v", e)
	}
	awaitHealth(t, a, 3, false)
	if err := injector.Clear(3); err != nil {
		t.Fatal(err)
	}
	e = awaitEvent(t, events, func(e nvmlnode.HealthEvent) bool { return e.Healed })
	if e.Device.Index != 3 || e.Err != nil {
		t.Fatalf("healed %+v", e)
	}
	awaitHealth(t, a, 3, true)
	// An XID that only asks to restart the application changes nothing.
	if err := injector.Inject(3, node.Signal{Kind: node.SignalXID, Value: 94}); err != nil {
		t.Fatal(err)
	}
	e = awaitEvent(t, events, func(e nvmlnode.HealthEvent) bool { return e.XID == 94 })
	if e.Verdict.State != node.StateInform || !a.Devices()[3].Health.Healthy {
		t.Fatalf("XID 94: %+v", e)
	}
}
