package node

import "errors"

// The error vocabulary every gpuiso package speaks. Each package's own
// sentinels and typed errors match one of these with errors.Is, so that one
// check covers a refusal whichever package (or back end) made it:
//
//	if errors.Is(err, node.ErrNotSupported) { ... } // Docker's Update, no cgroup v2, no NVML
var (
	// ErrNotSupported: the host, driver, daemon or back end does not offer
	// what was asked for. It is a normal result, not a fault.
	ErrNotSupported = errors.New("not supported")
	// ErrInvalid: the input is malformed: a bad id, request, rule, flag.
	ErrInvalid = errors.New("invalid input")
	// ErrExists: the thing to be created already exists (not now: the
	// call may succeed once it is gone).
	ErrExists = errors.New("already exists")
	// ErrNotFound: the thing named does not exist.
	ErrNotFound = errors.New("not found")
	// ErrInsufficient: not enough free resources (GPUs, memory) to grant a
	// request now; it may succeed later, once others let go. A request the
	// node could never grant, however much were free, is ErrInvalid or
	// ErrNotSupported instead.
	ErrInsufficient = errors.New("not enough free GPUs")
	// ErrUnavailable: the resource exists but cannot be used: a lost or
	// unhealthy GPU, a driver that is not loaded.
	ErrUnavailable = errors.New("unavailable")
	// ErrCorrupt: stored state cannot be trusted.
	ErrCorrupt = errors.New("corrupt state")
	// ErrNotMade: a value was not made with its constructor (a zero
	// Allocator, a nil Store): it refuses every call. Every package's own
	// ErrNotMade matches it, and ErrInvalid, so that one check covers them
	// all.
	ErrNotMade = Sentinel(ErrInvalid, "not made with its constructor")
)

// kindError is a package's own sentinel that also matches one of the
// shared sentinels above.
type kindError struct {
	msg  string
	kind error
}

func (e *kindError) Error() string { return e.msg }

// Is makes errors.Is(err, kind) hold.
func (e *kindError) Is(target error) bool { return target == e.kind }

// notMadeError is a package's ErrNotMade: it matches ErrNotMade and
// ErrInvalid.
type notMadeError struct{ msg string }

func (e *notMadeError) Error() string { return e.msg }

// Is makes errors.Is(err, ErrNotMade) and errors.Is(err, ErrInvalid) hold.
func (e *notMadeError) Is(target error) bool { return target == ErrNotMade || target == ErrInvalid }

// NotMade returns a package's sentinel for a value not made with its
// constructor, with the message msg ("allocator not made with New"): it
// matches itself, ErrNotMade and ErrInvalid.
func NotMade(msg string) error { return &notMadeError{msg: msg} }

// Sentinel returns a new sentinel error with the message msg that
// errors.Is matches against itself and against kind, one of this package's
// shared sentinels. Packages declare their own sentinels with it:
//
//	var ErrOwnerExists = node.Sentinel(node.ErrExists, "owner already holds an allocation")
func Sentinel(kind error, msg string) error { return &kindError{msg: msg, kind: kind} }

// Model errors.
var (
	// ErrInvalidTopology: a topology matrix is not square and symmetric, or
	// holds an unknown link.
	ErrInvalidTopology = Sentinel(ErrInvalid, "invalid topology")
	// ErrInvalidBusID: a string is not a PCI bus id.
	ErrInvalidBusID = Sentinel(ErrInvalid, "invalid PCI bus id")
)
