package dra

import (
	"context"
	"log/slog"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
)

// Op is an operation of the driver on one claim that an Observer is told
// of.
type Op string

// The operations observed.
const (
	OpPrepare   Op = "prepare"
	OpUnprepare Op = "unprepare"
)

// The steps of an operation, in the order they run (Event.Steps). A step
// that did not run is absent.
const (
	// StepWait is a wait for another operation: on the same claim, or on
	// the node's state (the allocator's hold, the CDI spec and rollbacks
	// are made one claim at a time; the claims' checkpoint writes
	// overlap). An operation may wait several times; Event.Step sums them.
	StepWait = "wait"
	// StepRead reads the claim's checkpoint.
	StepRead = "read"
	// StepRestore answers a claim prepared before: its devices held again
	// and its CDI spec written where missing or changed.
	StepRestore = "restore"
	// StepStarted records the claim's checkpoint PrepareStarted.
	StepStarted = "started"
	// StepAllocate holds the claim's devices in the allocator.
	StepAllocate = "allocate"
	// StepSpec writes the claim's CDI spec (a share's MPS daemon started
	// first).
	StepSpec = "spec"
	// StepCompleted records the claim's checkpoint PrepareCompleted.
	StepCompleted = "completed"
	// StepRollback undoes a preparation: a failed one's, one cut short,
	// or an unprepare's (MPS daemon, allocator hold, CDI spec,
	// checkpoint).
	StepRollback = "rollback"
)

// Step is one timed part of an operation.
type Step struct {
	Name string
	Took time.Duration
}

// Event is one prepare or unprepare of a claim, told when it ends.
type Event struct {
	Op  Op
	UID string
	// Devices is the number of the claim's devices of this driver that
	// a prepare answered with.
	Devices int
	// Recorded is true for a prepare answered from the claim's
	// checkpoint (a claim prepared before: idempotent).
	Recorded bool
	// Err is the operation's error, nil when it succeeded.
	Err error
	// Took is the time from the call to its answer, the wait for another
	// claim's operation included: what the kubelet waits.
	Took time.Duration
	// Steps are the timed parts of Took, in order.
	Steps []Step
}

// Step returns the time of the step name, 0 when it did not run.
func (e Event) Step(name string) time.Duration {
	var d time.Duration
	for _, s := range e.Steps {
		if s.Name == name {
			d += s.Took
		}
	}
	return d
}

// Observer is told of every prepare and unprepare of a claim, once each,
// as it ends (Config.Observer): a metrics exporter counts them and times
// them. Observe is called from the kubelet's calls, concurrently, and must
// not block.
type Observer interface {
	Observe(Event)
}

// ObserverFunc is a function as an Observer.
type ObserverFunc func(Event)

// Observe calls f.
func (f ObserverFunc) Observe(ev Event) { f(ev) }

// opTimer times one operation's steps.
type opTimer struct {
	ev    Event
	start time.Time
	last  time.Time
}

func startOp(op Op, uid string) *opTimer {
	now := time.Now()
	return &opTimer{ev: Event{Op: op, UID: uid}, start: now, last: now}
}

// step ends the step name, begun when the one before ended.
func (t *opTimer) step(name string) {
	if t == nil {
		return
	}
	now := time.Now()
	t.ev.Steps = append(t.ev.Steps, Step{Name: name, Took: now.Sub(t.last)})
	t.last = now
}

// end tells the driver's observer of the operation's end, and logs it
// with its timings: msg at info level when the operation succeeded and
// msg is not empty, else at debug level.
func (d *Driver) end(ctx context.Context, t *opTimer, err error, msg string, args ...any) {
	t.ev.Took, t.ev.Err = time.Since(t.start), err
	if d.cfg.Observer != nil {
		d.cfg.Observer.Observe(t.ev)
	}
	level := slog.LevelInfo
	if msg == "" || err != nil {
		level = slog.LevelDebug
		msg = string(t.ev.Op) + " claim"
	}
	if !d.cfg.Logger.Enabled(ctx, level) {
		return
	}
	args = append(args, "uid", t.ev.UID, "took", t.ev.Took)
	for _, s := range t.ev.Steps {
		args = append(args, s.Name, s.Took)
	}
	if t.ev.Recorded {
		args = append(args, "recorded", true)
	}
	if err != nil {
		args = append(args, "err", err)
	}
	d.cfg.Logger.Log(ctx, level, msg, args...)
}

// endPrepare ends a prepare of claim that answered devs, err.
func (d *Driver) endPrepare(ctx context.Context, t *opTimer, claim *resourceapi.ResourceClaim, devs []kubeletplugin.Device, err error) {
	t.ev.Devices = len(devs)
	msg := "prepared claim"
	if t.ev.Recorded || len(devs) == 0 {
		msg = ""
	}
	d.end(ctx, t, err, msg, "claim", claim.Namespace+"/"+claim.Name, "devices", len(devs))
}

// lock locks mu; the time it waited counts as StepWait.
func (t *opTimer) lock(mu *sync.Mutex) {
	mu.Lock()
	t.step(StepWait)
}
