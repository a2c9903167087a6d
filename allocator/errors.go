package allocator

import (
	"errors"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Discovery errors.
var (
	// ErrLibraryNotFound: the NVML library (libnvidia-ml.so.1) is not
	// installed, so this node has no NVIDIA driver at all.
	ErrLibraryNotFound = errors.New("NVML library libnvidia-ml.so.1 not found")
	// ErrDriverNotLoaded: the NVML library is installed but the NVIDIA kernel
	// driver is not loaded (no GPU, or the module failed to load).
	ErrDriverNotLoaded = errors.New("NVIDIA kernel driver not loaded")
	// ErrGPULost: the GPU stopped answering (fell off the bus).
	ErrGPULost = errors.New("GPU is lost")
	// ErrNotSupported: NVML, the device or the operating system does not
	// offer what was asked for.
	ErrNotSupported = errors.New("not supported")
	// ErrInvalidTopology: a topology matrix is not square and symmetric, or
	// holds an unknown link.
	ErrInvalidTopology = errors.New("invalid topology")
	// ErrInvalidBusID: a string is not a PCI bus id.
	ErrInvalidBusID = errors.New("invalid PCI bus id")
)

// NVMLError is an NVML call that did not succeed.
type NVMLError struct {
	// Op names the call, e.g. "init" or "get uuid".
	Op string
	// Device is the NVML index of the device the call was about, or -1.
	Device int
	// Return is NVML's result code.
	Return nvml.Return
}

func (e *NVMLError) Error() string {
	if e.Device >= 0 {
		return fmt.Sprintf("nvml: gpu %d: %s: %s", e.Device, e.Op, nvml.ErrorString(e.Return))
	}
	return fmt.Sprintf("nvml: %s: %s", e.Op, nvml.ErrorString(e.Return))
}

// Is maps NVML's result codes to this package's sentinels, so that
// errors.Is(err, ErrDriverNotLoaded) holds for ERROR_DRIVER_NOT_LOADED.
func (e *NVMLError) Is(target error) bool {
	switch target {
	case ErrLibraryNotFound:
		return e.Return == nvml.ERROR_LIBRARY_NOT_FOUND
	case ErrDriverNotLoaded:
		return e.Return == nvml.ERROR_DRIVER_NOT_LOADED
	case ErrGPULost:
		return e.Return == nvml.ERROR_GPU_IS_LOST
	case ErrNotSupported:
		return e.Return == nvml.ERROR_NOT_SUPPORTED || e.Return == nvml.ERROR_FUNCTION_NOT_FOUND
	}
	return false
}

func nvmlError(op string, device int, ret nvml.Return) error {
	if ret == nvml.SUCCESS {
		return nil
	}
	return &NVMLError{Op: op, Device: device, Return: ret}
}

// Allocation errors.
var (
	// ErrInsufficient: the node has fewer free, healthy GPUs matching the
	// request than it asks for. See InsufficientError.
	ErrInsufficient = errors.New("not enough free GPUs")
	// ErrUnknownOwner: no allocation is held by the owner.
	ErrUnknownOwner = errors.New("unknown owner")
	// ErrOwnerExists: the owner already holds an allocation (use Resize).
	ErrOwnerExists = errors.New("owner already holds an allocation")
	// ErrInvalidOwner: an owner id is empty, too long, or holds characters
	// that cannot be part of a cgroup path. See InvalidOwnerError.
	ErrInvalidOwner = errors.New("invalid owner id")
	// ErrUnknownDevice: a device reference (index, UUID or bus id) names no
	// GPU of the node.
	ErrUnknownDevice = errors.New("unknown device")
	// ErrDuplicateDevice: a request names one GPU twice.
	ErrDuplicateDevice = errors.New("device named twice")
	// ErrDeviceUnavailable: a GPU named in a request is owned, shared,
	// unhealthy, or does not match the request's constraints.
	ErrDeviceUnavailable = errors.New("device unavailable")
	// ErrInvalidRequest: a request is malformed (negative or zero count,
	// more GPUs than the node has, a bad constraint, ...).
	ErrInvalidRequest = errors.New("invalid request")
	// ErrInvalidConstraint: a constraint or affinity cannot be parsed or
	// has an unknown operator.
	ErrInvalidConstraint = errors.New("invalid constraint")
	// ErrQuotaExceeded: granting the request would take a group over its
	// GPU quota. See QuotaError.
	ErrQuotaExceeded = errors.New("GPU quota exceeded")
	// ErrCorruptState: the allocator's state file is truncated, fails its
	// checksum, has an unknown format version or contradicts itself. See
	// StateError.
	ErrCorruptState = errors.New("corrupt allocator state")
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
func (e *InsufficientError) Is(target error) bool { return target == ErrInsufficient }

// InvalidOwnerError is an owner id that cannot be accepted.
type InvalidOwnerError struct {
	Owner  string
	Reason string
}

func (e *InvalidOwnerError) Error() string {
	return fmt.Sprintf("owner %q: %s: %s", e.Owner, e.Reason, ErrInvalidOwner)
}

// Is makes errors.Is(err, ErrInvalidOwner) hold.
func (e *InvalidOwnerError) Is(target error) bool { return target == ErrInvalidOwner }

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
func (e *QuotaError) Is(target error) bool { return target == ErrQuotaExceeded }

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
func (e *StateError) Is(target error) bool { return target == ErrCorruptState }
