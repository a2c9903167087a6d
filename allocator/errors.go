package allocator

import (
	"fmt"

	"github.com/gpuiso/gpuiso/node"
)

// Allocation errors.
var (
	// ErrInsufficient: the node has fewer free, healthy GPUs matching the
	// request than it asks for. See InsufficientError.
	ErrInsufficient = node.Sentinel(node.ErrInsufficient, "not enough free GPUs")
	// ErrUnknownOwner: no allocation is held by the owner.
	ErrUnknownOwner = node.Sentinel(node.ErrNotFound, "unknown owner")
	// ErrOwnerExists: the owner already holds an allocation (use Resize).
	ErrOwnerExists = node.Sentinel(node.ErrExists, "owner already holds an allocation")
	// ErrUnknownDevice: a device reference (index, UUID or bus id) names no
	// GPU of the node.
	ErrUnknownDevice = node.Sentinel(node.ErrNotFound, "unknown device")
	// ErrDuplicateDevice: a request names one GPU twice.
	ErrDuplicateDevice = node.Sentinel(node.ErrInvalid, "device named twice")
	// ErrDeviceUnavailable: a GPU named in a request is owned, shared,
	// unhealthy, or does not match the request's constraints.
	ErrDeviceUnavailable = node.Sentinel(node.ErrUnavailable, "device unavailable")
	// ErrInvalidRequest: a request is malformed (negative or zero count,
	// more GPUs than the node has, a bad constraint, ...).
	ErrInvalidRequest = node.Sentinel(node.ErrInvalid, "invalid request")
	// ErrInvalidConstraint: a constraint or affinity cannot be parsed or
	// has an unknown operator.
	ErrInvalidConstraint = node.Sentinel(node.ErrInvalid, "invalid constraint")
	// ErrQuotaExceeded: granting the request would take a group over its
	// GPU quota. See QuotaError.
	ErrQuotaExceeded = node.Sentinel(node.ErrInsufficient, "GPU quota exceeded")
	// ErrCorruptState: the allocator's state file is truncated, fails its
	// checksum, has an unknown format version or contradicts itself. See
	// StateError.
	ErrCorruptState = node.Sentinel(node.ErrCorrupt, "corrupt allocator state")
	// ErrNotMade: an Allocator was not made with New (its zero value): it
	// refuses every call.
	ErrNotMade = node.NotMade("allocator not made with New")
)

// InsufficientError is a request for more GPUs than are free.
type InsufficientError struct {
	// Requested is the number of GPUs (or, for a shared request, bytes of
	// memory) asked for.
	Requested int
	// Free is how many free, healthy GPUs matching the request there are
	// (or the most memory free on one shareable GPU).
	Free int
}

func (e *InsufficientError) Error() string {
	return fmt.Sprintf("requested %d, %d free: %s", e.Requested, e.Free, ErrInsufficient)
}

// Is makes errors.Is(err, ErrInsufficient) hold.
func (e *InsufficientError) Is(target error) bool {
	return target == ErrInsufficient || target == node.ErrInsufficient
}

// QuotaError is a request that would take a group over its quota.
type QuotaError struct {
	Group     string
	Limit     int // GPUs the group may hold
	Used      int // GPUs it holds now
	Requested int // GPUs the request adds
}

func (e *QuotaError) Error() string {
	return fmt.Sprintf("group %q holds %d of %d GPUs, request adds %d: %s", e.Group, e.Used, e.Limit, e.Requested, ErrQuotaExceeded)
}

// Is makes errors.Is(err, ErrQuotaExceeded) hold.
func (e *QuotaError) Is(target error) bool {
	return target == ErrQuotaExceeded || target == node.ErrInsufficient
}

// StateError is a state file that cannot be trusted. The allocator never
// replaces such a file on its own: an operator must look at it.
type StateError struct {
	// File is the state file's path.
	File string
	// Err says what is wrong with it.
	Err error
}

func (e *StateError) Error() string {
	return fmt.Sprintf("state file %s: %v", e.File, e.Err)
}

// Unwrap returns the cause.
func (e *StateError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrCorruptState) hold.
func (e *StateError) Is(target error) bool {
	return target == ErrCorruptState || target == node.ErrCorrupt
}

// ErrClaimMismatch: a claim names other devices than those its owner
// holds. See ClaimError.
var ErrClaimMismatch = node.Sentinel(node.ErrExists, "owner holds other devices")

// ClaimError is a claim of devices other than those its owner holds.
type ClaimError struct {
	Owner string
	// Held are the devices the owner holds, Claimed those claimed: UUIDs
	// (indexes for devices without one), sorted.
	Held, Claimed []string
}

func (e *ClaimError) Error() string {
	return fmt.Sprintf("%s holds %v, claimed %v: %s", e.Owner, e.Held, e.Claimed, ErrClaimMismatch)
}

// Is makes errors.Is(err, ErrClaimMismatch) hold.
func (e *ClaimError) Is(target error) bool {
	return target == ErrClaimMismatch || target == node.ErrExists
}

// ErrLocked: another process held the state directory's lock until the
// context of a wait for it ended. See LockError.
var ErrLocked = node.Sentinel(node.ErrUnavailable, "state directory locked")

// LockError is a wait for the state directory's lock that the caller's
// context ended (its deadline, or a cancellation) while another process
// held the lock.
type LockError struct {
	// Dir is the state directory.
	Dir string
	// Holder is the process holding the lock, as it named itself on
	// taking it; nil when unknown (it wrote no name, or no longer runs).
	Holder *Holder
	// Command is the holder's command name (/proc/<pid>/comm), "" when
	// unknown.
	Command string
	// Err is why the wait ended: the context's error or cause.
	Err error
}

func (e *LockError) Error() string {
	who := "another process (unknown)"
	if e.Holder != nil {
		who = fmt.Sprintf("pid %d started at %d", e.Holder.Pid, e.Holder.Start)
		if e.Command != "" {
			who = fmt.Sprintf("pid %d (%s) started at %d", e.Holder.Pid, e.Command, e.Holder.Start)
		}
	}
	return fmt.Sprintf("state directory %s held by %s: %v: %s", e.Dir, who, e.Err, ErrLocked)
}

// Unwrap returns why the wait ended (context.DeadlineExceeded, say).
func (e *LockError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrLocked) hold.
func (e *LockError) Is(target error) bool {
	return target == ErrLocked || target == node.ErrUnavailable
}
