package simnode

import (
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// supportedEvents are the event types simulated GPUs can report.
const supportedEvents = nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError | nvml.EventTypeSingleBitEccError | nvml.EventTypeGpuRecoveryAction

// eventSet is a simulated NVML event set: a queue that Wait drains.
type eventSet struct {
	*mock.EventSet

	node *Node

	mu         sync.Mutex
	registered map[int]uint64 // GPU index -> event types
	queue      []nvml.EventData
	wake       chan struct{} // closed and replaced when an event arrives
	freed      bool
}

func (n *Node) newEventSet() nvml.EventSet {
	s := &eventSet{node: n, EventSet: &mock.EventSet{}, registered: map[int]uint64{}, wake: make(chan struct{})}
	s.WaitFunc = s.wait
	s.FreeFunc = func() nvml.Return {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.freed {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		s.freed = true
		close(s.wake)
		return nvml.SUCCESS
	}
	fillNotSupported(s.EventSet)
	n.mu.Lock()
	n.sets = append(n.sets, s)
	n.mu.Unlock()
	return s.EventSet
}

func (n *Node) register(i int, types uint64, set nvml.EventSet) nvml.Return {
	if types&^supportedEvents != 0 {
		return nvml.ERROR_NOT_SUPPORTED
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, s := range n.sets {
		if s.EventSet == set {
			s.mu.Lock()
			defer s.mu.Unlock()
			if s.freed {
				return nvml.ERROR_INVALID_ARGUMENT
			}
			s.registered[i] |= types
			return nvml.SUCCESS
		}
	}
	return nvml.ERROR_INVALID_ARGUMENT
}

// deliverTo queues an event of GPU i, attributed to GPU instance gi and
// compute instance ci (invalidInstance for the whole GPU).
func (n *Node) deliverTo(i int, eventType, data uint64, gi, ci uint32) {
	n.mu.Lock()
	sets := append([]*eventSet(nil), n.sets...)
	n.mu.Unlock()
	for _, s := range sets {
		s.mu.Lock()
		if !s.freed && s.registered[i]&eventType != 0 {
			s.queue = append(s.queue, nvml.EventData{Device: n.devices[i], EventType: eventType, EventData: data, GpuInstanceId: gi, ComputeInstanceId: ci})
			close(s.wake)
			s.wake = make(chan struct{})
		}
		s.mu.Unlock()
	}
}

// faultsPoll is how often a wait reads a shared host tree's faults for
// events injected by another node.
const faultsPoll = 20 * time.Millisecond

// wait returns the oldest queued event, waiting up to timeout milliseconds
// for one; ERROR_TIMEOUT when none came. With ShareFaults it also reads
// the host tree for events another node injected.
func (s *eventSet) wait(timeoutMs uint32) (nvml.EventData, nvml.Return) {
	timer := time.NewTimer(time.Duration(timeoutMs) * time.Millisecond)
	defer timer.Stop()
	var poll <-chan time.Time
	if s.node.sharesFaults() {
		t := time.NewTicker(faultsPoll)
		defer t.Stop()
		poll = t.C
		s.node.syncFaults()
	}
	for {
		s.mu.Lock()
		if s.freed {
			s.mu.Unlock()
			return nvml.EventData{}, nvml.ERROR_UNINITIALIZED
		}
		if len(s.queue) > 0 {
			e := s.queue[0]
			s.queue = s.queue[1:]
			s.mu.Unlock()
			return e, nvml.SUCCESS
		}
		wake := s.wake
		s.mu.Unlock()
		select {
		case <-wake:
		case <-poll:
			s.node.syncFaults()
		case <-timer.C:
			return nvml.EventData{}, nvml.ERROR_TIMEOUT
		}
	}
}
