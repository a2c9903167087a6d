package containerizer

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/gpuiso/gpuiso/node"
)

// A container's life, as every back end's Table keeps it:
//
//	(none) --Begin--> launching --Settle(ok)--> running --Exited--> exited
//	   |                  |  \--Settle(failed)--> (none)               |
//	   |                  \--Exited (ended before its launch returned) |
//	   \--Adopt (recovery)--> running or exited                        |
//	running, exited --Destroying--> destroying --Remove--> (none)
//	                                destroying --Restore--> running or exited
//
// Any other change is refused with a *TransitionError. Destroy of a
// launching container is decided here, once for every back end: it waits
// for the launch to end (Destroying blocks until Settle), then destroys
// what the launch left, or nothing when the launch failed and undid itself.

// ErrTransition: a container cannot go from its state to the one asked
// (see TransitionError).
var ErrTransition = node.Sentinel(node.ErrInvalid, "impossible container state transition")

// stateNone is the state of a container that does not exist (before its
// launch, after its destruction); it is never shown in a Container.
const stateNone State = ""

// TransitionError is a state change the lifecycle does not allow.
type TransitionError struct {
	ID       string
	From, To State
}

func (e *TransitionError) Error() string {
	return fmt.Sprintf("container %s: %s to %s: %s", e.ID, stateName(e.From), stateName(e.To), ErrTransition)
}

// Is makes errors.Is(err, ErrTransition) hold.
func (e *TransitionError) Is(target error) bool {
	return target == ErrTransition || target == node.ErrInvalid
}

func stateName(s State) string {
	if s == stateNone {
		return "none"
	}
	return string(s)
}

// transitions are the allowed changes, by state.
var transitions = map[State][]State{
	stateNone:       {StateLaunching, StateRunning, StateExited},
	StateLaunching:  {StateRunning, StateExited, stateNone},
	StateRunning:    {StateExited, StateDestroying},
	StateExited:     {StateDestroying},
	StateDestroying: {stateNone, StateRunning, StateExited},
}

// CanTransition tells whether a container may go from one state to
// another; "" stands for no container.
func CanTransition(from, to State) bool {
	return slices.Contains(transitions[from], to)
}

// Table is a back end's containers by id, each with its state and the back
// end's own data V (a pointer, usually, that tells one container from a
// later one of the same id). It is the one table of launches in
// progress: an id is reserved from Begin to Settle, and Destroy of a
// launching container waits for Settle. It is safe for concurrent use; its
// zero value is empty and ready.
type Table[V comparable] struct {
	mu      sync.Mutex
	entries map[string]*slot[V]
}

type slot[V comparable] struct {
	state State
	// prev is the state Destroying left, for Restore.
	prev State
	val  V
	// settled is closed when a launch has ended, either way; nil for an
	// adopted container.
	settled chan struct{}
}

func (t *Table[V]) move(id string, s *slot[V], to State) error {
	// A container that is not in the table enters it only by Begin or
	// Adopt.
	if s == nil || !CanTransition(s.state, to) {
		return &TransitionError{ID: id, From: stateOf(s), To: to}
	}
	s.state = to
	return nil
}

// Begin reserves id for a launch (launching) with data v. An id in the
// table already is refused with an error matching ErrContainerExists.
func (t *Table[V]) Begin(id string, v V) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.entries[id]; ok {
		return fmt.Errorf("%s: %w", id, ErrContainerExists)
	}
	if t.entries == nil {
		t.entries = map[string]*slot[V]{}
	}
	t.entries[id] = &slot[V]{state: StateLaunching, val: v, settled: make(chan struct{})}
	return nil
}

// Settle ends id's launch: a launch that succeeded leaves it running (or
// exited, if it ended meanwhile), one that failed removes it. Whoever waits
// in Destroying goes on.
func (t *Table[V]) Settle(id string, ok bool) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.entries[id]
	if s == nil || s.settled == nil || isClosed(s.settled) {
		return &TransitionError{ID: id, From: stateOf(s), To: StateRunning}
	}
	defer close(s.settled)
	switch {
	case !ok:
		delete(t.entries, id)
	case s.state == StateLaunching:
		s.state = StateRunning
	}
	return nil
}

func stateOf[V comparable](s *slot[V]) State {
	if s == nil {
		return stateNone
	}
	return s.state
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// Adopt enters a container that a recovery found, running or exited.
func (t *Table[V]) Adopt(id string, state State, v V) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.entries[id]
	if s != nil {
		return &TransitionError{ID: id, From: s.state, To: state}
	}
	if state != StateRunning && state != StateExited {
		return &TransitionError{ID: id, From: stateNone, To: state}
	}
	if t.entries == nil {
		t.entries = map[string]*slot[V]{}
	}
	t.entries[id] = &slot[V]{state: state, val: v}
	return nil
}

// Get returns id's data and state; an id not in the table is an error
// matching ErrUnknownContainer.
func (t *Table[V]) Get(id string) (V, State, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s, ok := t.entries[id]
	if !ok {
		var zero V
		return zero, stateNone, fmt.Errorf("%s: %w", id, ErrUnknownContainer)
	}
	return s.val, s.state, nil
}

// Settled returns id's data and state once it is not launching: a
// launching container is waited for (until ctx ends). ErrUnknownContainer
// when there is no such container, or its launch failed.
func (t *Table[V]) Settled(ctx context.Context, id string) (V, State, error) {
	if err := t.await(ctx, id); err != nil {
		var zero V
		return zero, stateNone, err
	}
	return t.Get(id)
}

func (t *Table[V]) await(ctx context.Context, id string) error {
	t.mu.Lock()
	s, ok := t.entries[id]
	t.mu.Unlock()
	if !ok || s.settled == nil {
		return nil
	}
	select {
	case <-s.settled:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%s: waiting for its launch: %w", id, ctx.Err())
	}
}

// Exited records that the command of id's container v ended: running (or
// launching) becomes exited; a container being destroyed stays so. It
// reports whether the state changed. It changes nothing when id is no
// longer v's (destroyed, or its launch failed and the id was taken again).
func (t *Table[V]) Exited(id string, v V) (bool, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.entries[id]
	if s == nil || s.val != v {
		return false, nil
	}
	switch s.state {
	case StateExited, StateDestroying:
		return false, nil
	}
	if err := t.move(id, s, StateExited); err != nil {
		return false, err
	}
	return true, nil
}

// Destroying starts id's destruction and returns its data and the state it
// left. A launching container is waited for first (until ctx ends): a
// launch that failed leaves nothing, and ok is false, as for an id not in
// the table. A container already being destroyed is a *TransitionError.
func (t *Table[V]) Destroying(ctx context.Context, id string) (v V, from State, ok bool, err error) {
	if err := t.await(ctx, id); err != nil {
		return v, stateNone, false, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	s, found := t.entries[id]
	if !found {
		return v, stateNone, false, nil
	}
	from = s.state
	if err := t.move(id, s, StateDestroying); err != nil {
		return v, from, false, err
	}
	s.prev = from
	return s.val, from, true, nil
}

// Remove ends id's destruction: it leaves the table.
func (t *Table[V]) Remove(id string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.entries[id]
	if err := t.move(id, s, stateNone); err != nil {
		return err
	}
	delete(t.entries, id)
	return nil
}

// Restore takes back a destruction that failed: id is again as it was
// before Destroying (or exited, if its command ended meanwhile), to be
// destroyed later.
func (t *Table[V]) Restore(id string, exited bool) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.entries[id]
	to := StateRunning
	if s != nil && (exited || s.prev == StateExited) {
		to = StateExited
	}
	return t.move(id, s, to)
}

// Set replaces id's data, whatever its state.
func (t *Table[V]) Set(id string, v V) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	s, ok := t.entries[id]
	if !ok {
		return fmt.Errorf("%s: %w", id, ErrUnknownContainer)
	}
	s.val = v
	return nil
}

// Delete drops id whatever its state (a recovery that finds a container
// gone); a launch in progress is left alone. It reports whether id left.
func (t *Table[V]) Delete(id string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	s, ok := t.entries[id]
	if !ok || s.state == StateLaunching {
		return false
	}
	delete(t.entries, id)
	return true
}

// Entry is one container of a Table.
type Entry[V comparable] struct {
	ID    string
	State State
	Value V
}

// List returns the table's containers by id; launching ones only with
// launching set.
func (t *Table[V]) List(launching bool) []Entry[V] {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]Entry[V], 0, len(t.entries))
	for id, s := range t.entries {
		if s.state == StateLaunching && !launching {
			continue
		}
		out = append(out, Entry[V]{ID: id, State: s.state, Value: s.val})
	}
	slices.SortFunc(out, func(a, b Entry[V]) int { return strings.Compare(a.ID, b.ID) })
	return out
}
