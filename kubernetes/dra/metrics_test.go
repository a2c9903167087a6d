package dra_test

import (
	"errors"
	"os"
	"slices"
	"sync"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/kubernetes/dra"
)

// TestObserver: the observer is told of each prepare and unprepare once,
// as it ends: its result, the devices it answered, whether it was answered
// from the checkpoint, and its steps in order, whose times add up to at
// most its duration.
func TestObserver(t *testing.T) {
	e := newEnv(t, "dgx1-volta")
	for _, dir := range []string{e.allocDir, e.cdiDir} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	a, err := allocator.New(e.inv, allocator.WithStateDir(e.allocDir))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	var mu sync.Mutex
	var events []dra.Event
	d, err := dra.New(e.inv, a, dra.Config{CDIDir: e.cdiDir, StateDir: e.stateDir, Observer: dra.ObserverFunc(func(ev dra.Event) {
		mu.Lock()
		defer mu.Unlock()
		events = append(events, ev)
	})})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if _, err := d.Prepare(ctx, claim("o1", "gpu-1")); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Prepare(ctx, claim("o1", "gpu-1")); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Prepare(ctx, claim("o2", "gpu-99")); !errors.Is(err, dra.ErrUnknownDevice) {
		t.Fatalf("unknown device: %v", err)
	}
	if err := d.Unprepare(ctx, "o1"); err != nil {
		t.Fatal(err)
	}
	if err := d.Unprepare(ctx, "o1"); err != nil {
		t.Fatal(err)
	}
	names := func(ev dra.Event) []string {
		var out []string
		for _, s := range ev.Steps {
			out = append(out, s.Name)
		}
		return out
	}
	want := []struct {
		op       dra.Op
		uid      string
		devices  int
		recorded bool
		failed   bool
		steps    []string
	}{
		{dra.OpPrepare, "o1", 1, false, false, []string{dra.StepWait, dra.StepRead, dra.StepStarted, dra.StepWait, dra.StepAllocate, dra.StepSpec, dra.StepCompleted}},
		{dra.OpPrepare, "o1", 1, true, false, []string{dra.StepWait, dra.StepRead, dra.StepWait, dra.StepRestore}},
		{dra.OpPrepare, "o2", 0, false, true, []string{dra.StepWait, dra.StepRead}},
		{dra.OpUnprepare, "o1", 0, false, false, []string{dra.StepWait, dra.StepRead, dra.StepWait, dra.StepRollback}},
		{dra.OpUnprepare, "o1", 0, false, false, []string{dra.StepWait, dra.StepRead}},
	}
	if len(events) != len(want) {
		t.Fatalf("%d events, want %d: %+v", len(events), len(want), events)
	}
	for i, w := range want {
		ev := events[i]
		if ev.Op != w.op || ev.UID != w.uid || ev.Devices != w.devices || ev.Recorded != w.recorded || (ev.Err != nil) != w.failed {
			t.Errorf("event %d: %s %s devices %d recorded %v err %v; want %s %s %d %v failed %v", i, ev.Op, ev.UID, ev.Devices, ev.Recorded, ev.Err, w.op, w.uid, w.devices, w.recorded, w.failed)
		}
		if got := names(ev); !slices.Equal(got, w.steps) {
			t.Errorf("event %d steps %v, want %v", i, got, w.steps)
		}
		var sum int64
		for _, s := range ev.Steps {
			sum += int64(s.Took)
		}
		if ev.Took <= 0 || sum > int64(ev.Took) {
			t.Errorf("event %d took %v, its steps %v", i, ev.Took, sum)
		}
		if ev.Step(dra.StepWait) < 0 {
			t.Errorf("event %d: negative wait", i)
		}
	}
}
