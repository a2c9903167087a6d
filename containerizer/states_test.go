package containerizer_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/gpuiso/gpuiso/containerizer"
)

// TestTransitionMatrix: every pair of states, allowed or refused, as the
// lifecycle says.
func TestTransitionMatrix(t *testing.T) {
	const none = containerizer.State("")
	states := []containerizer.State{none, containerizer.StateLaunching, containerizer.StateRunning, containerizer.StateExited, containerizer.StateDestroying}
	allowed := map[[2]containerizer.State]bool{
		{none, containerizer.StateLaunching}:                        true, // Begin
		{none, containerizer.StateRunning}:                          true, // Adopt
		{none, containerizer.StateExited}:                           true, // Adopt
		{containerizer.StateLaunching, containerizer.StateRunning}:  true, // Settle(ok)
		{containerizer.StateLaunching, containerizer.StateExited}:   true, // ended before its launch returned
		{containerizer.StateLaunching, none}:                        true, // Settle(failed)
		{containerizer.StateRunning, containerizer.StateExited}:     true,
		{containerizer.StateRunning, containerizer.StateDestroying}: true,
		{containerizer.StateExited, containerizer.StateDestroying}:  true,
		{containerizer.StateDestroying, none}:                       true, // Remove
		{containerizer.StateDestroying, containerizer.StateRunning}: true, // Restore
		{containerizer.StateDestroying, containerizer.StateExited}:  true, // Restore
	}
	for _, from := range states {
		for _, to := range states {
			name := fmt.Sprintf("%q to %q", from, to)
			if got := containerizer.CanTransition(from, to); got != allowed[[2]containerizer.State{from, to}] {
				t.Errorf("%s: allowed %v, want %v", name, got, !got)
			}
		}
	}
}

// tableAt returns a table holding container "c" in state s ("" for none).
func tableAt(t *testing.T, s containerizer.State) *containerizer.Table[int] {
	t.Helper()
	tb := &containerizer.Table[int]{}
	var err error
	switch s {
	case "":
	case containerizer.StateLaunching:
		err = tb.Begin("c", 1)
	case containerizer.StateRunning, containerizer.StateExited:
		err = tb.Adopt("c", s, 1)
	case containerizer.StateDestroying:
		err = tb.Adopt("c", containerizer.StateRunning, 1)
		if err == nil {
			_, _, _, err = tb.Destroying(context.Background(), "c")
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	return tb
}

// TestTableOperations: each operation from each state: the state it
// leaves, or a typed error and the state unchanged.
func TestTableOperations(t *testing.T) {
	ctx := context.Background()
	const none = containerizer.State("")
	type op struct {
		name string
		do   func(*containerizer.Table[int]) error
	}
	ops := map[string]op{
		"begin":   {"begin", func(tb *containerizer.Table[int]) error { return tb.Begin("c", 2) }},
		"settle":  {"settle", func(tb *containerizer.Table[int]) error { return tb.Settle("c", true) }},
		"fail":    {"fail", func(tb *containerizer.Table[int]) error { return tb.Settle("c", false) }},
		"adopt":   {"adopt", func(tb *containerizer.Table[int]) error { return tb.Adopt("c", containerizer.StateRunning, 2) }},
		"exited":  {"exited", func(tb *containerizer.Table[int]) error { _, err := tb.Exited("c", 1); return err }},
		"remove":  {"remove", func(tb *containerizer.Table[int]) error { return tb.Remove("c") }},
		"restore": {"restore", func(tb *containerizer.Table[int]) error { return tb.Restore("c", false) }},
		"destroying": {"destroying", func(tb *containerizer.Table[int]) error {
			_, _, _, err := tb.Destroying(ctx, "c")
			return err
		}},
	}
	cases := []struct {
		from containerizer.State
		op   string
		want containerizer.State // state after; ignored on error
		err  error
	}{
		{none, "begin", containerizer.StateLaunching, nil},
		{containerizer.StateLaunching, "begin", containerizer.StateLaunching, containerizer.ErrContainerExists},
		{containerizer.StateRunning, "begin", containerizer.StateRunning, containerizer.ErrContainerExists},
		{containerizer.StateLaunching, "settle", containerizer.StateRunning, nil},
		{containerizer.StateLaunching, "fail", none, nil},
		{containerizer.StateRunning, "settle", containerizer.StateRunning, containerizer.ErrTransition},
		{none, "settle", none, containerizer.ErrTransition},
		{none, "adopt", containerizer.StateRunning, nil},
		{containerizer.StateRunning, "adopt", containerizer.StateRunning, containerizer.ErrTransition},
		{containerizer.StateLaunching, "exited", containerizer.StateExited, nil},
		{containerizer.StateRunning, "exited", containerizer.StateExited, nil},
		{containerizer.StateExited, "exited", containerizer.StateExited, nil},
		{containerizer.StateDestroying, "exited", containerizer.StateDestroying, nil},
		{none, "exited", none, nil}, // a container gone: nothing to record
		{containerizer.StateRunning, "destroying", containerizer.StateDestroying, nil},
		{containerizer.StateExited, "destroying", containerizer.StateDestroying, nil},
		{containerizer.StateDestroying, "destroying", containerizer.StateDestroying, containerizer.ErrTransition},
		{none, "destroying", none, nil}, // nothing to destroy
		{containerizer.StateDestroying, "remove", none, nil},
		{containerizer.StateRunning, "remove", containerizer.StateRunning, containerizer.ErrTransition},
		{containerizer.StateExited, "remove", containerizer.StateExited, containerizer.ErrTransition},
		{containerizer.StateDestroying, "restore", containerizer.StateRunning, nil},
		{containerizer.StateRunning, "restore", containerizer.StateRunning, containerizer.ErrTransition},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%s from %q", tc.op, tc.from), func(t *testing.T) {
			tb := tableAt(t, tc.from)
			err := ops[tc.op].do(tb)
			if !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
				t.Fatalf("%s: %v, want %v", tc.op, err, tc.err)
			}
			var te *containerizer.TransitionError
			if errors.Is(err, containerizer.ErrTransition) && (!errors.As(err, &te) || te.ID != "c") {
				t.Fatalf("%v is no *TransitionError of c", err)
			}
			want := tc.want
			if err != nil {
				want = tc.from
			}
			_, got, _ := tb.Get("c")
			if got != want {
				t.Fatalf("after %s: %q, want %q", tc.op, got, want)
			}
		})
	}
}

// TestDestroyDuringLaunch: a Destroy that comes while the launch is in
// progress waits for it; after a launch that succeeded it destroys the
// container, after one that failed there is nothing to destroy. Run with
// -race.
func TestDestroyDuringLaunch(t *testing.T) {
	for _, launched := range []bool{true, false} {
		t.Run(fmt.Sprintf("launch ok=%v", launched), func(t *testing.T) {
			ctx := context.Background()
			tb := &containerizer.Table[*int]{}
			val := new(int)
			if err := tb.Begin("c", val); err != nil {
				t.Fatal(err)
			}
			const destroyers = 4
			type result struct {
				ok  bool
				err error
			}
			results := make(chan result, destroyers)
			var started sync.WaitGroup
			for range destroyers {
				started.Add(1)
				go func() {
					started.Done()
					v, _, ok, err := tb.Destroying(ctx, "c")
					if ok && *v != 42 {
						err = fmt.Errorf("destroy saw the launch's data unfinished: %d", *v)
					}
					if ok && err == nil {
						err = tb.Remove("c")
					}
					results <- result{ok, err}
				}()
			}
			started.Wait()
			// The launch writes its data while Destroy waits: the race
			// detector sees whether Destroy reads it before Settle.
			*val = 42
			if err := tb.Settle("c", launched); err != nil {
				t.Fatal(err)
			}
			oks, transitions := 0, 0
			for range destroyers {
				r := <-results
				switch {
				case r.ok && r.err == nil:
					oks++
				case errors.Is(r.err, containerizer.ErrTransition):
					transitions++ // another Destroy was at it
				case r.err != nil:
					t.Fatalf("destroy: %v", r.err)
				}
			}
			if want := map[bool]int{true: 1, false: 0}[launched]; oks != want {
				t.Fatalf("%d destroys did the work, want %d", oks, want)
			}
			if _, _, err := tb.Get("c"); !errors.Is(err, containerizer.ErrUnknownContainer) {
				t.Fatalf("after destroy: %v", err)
			}
			if err := tb.Begin("c", nil); err != nil {
				t.Fatalf("the id cannot be used again: %v", err)
			}
		})
	}
}

// TestDestroyWaitBounded: a Destroy waiting for a launch gives up with its
// context, and the launch goes on.
func TestDestroyWaitBounded(t *testing.T) {
	tb := &containerizer.Table[int]{}
	if err := tb.Begin("c", 1); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, _, err := tb.Destroying(ctx, "c"); !errors.Is(err, context.Canceled) {
		t.Fatalf("destroying with an ended context: %v", err)
	}
	if _, st, _ := tb.Get("c"); st != containerizer.StateLaunching {
		t.Fatalf("state %q after a destroy gave up, want launching", st)
	}
}

// TestExitedOfAnEarlierContainer: the exit of a container whose launch
// failed does not mark a later container of the same id exited.
func TestExitedOfAnEarlierContainer(t *testing.T) {
	tb := &containerizer.Table[int]{}
	if err := tb.Begin("c", 1); err != nil {
		t.Fatal(err)
	}
	if err := tb.Settle("c", false); err != nil {
		t.Fatal(err)
	}
	if err := tb.Begin("c", 2); err != nil {
		t.Fatal(err)
	}
	if changed, err := tb.Exited("c", 1); changed || err != nil {
		t.Fatalf("exit of the earlier container: %v, %v", changed, err)
	}
	if _, st, _ := tb.Get("c"); st != containerizer.StateLaunching {
		t.Fatalf("the later container is %q, want launching", st)
	}
}
