package isolator

import "errors"

var (
	// ErrInvalidRule: a device rule is malformed.
	ErrInvalidRule = errors.New("invalid device rule")
	// ErrNotSupported: the host lacks what the back end needs (no cgroup
	// v2, no devices controller, not Linux, no permission for eBPF).
	ErrNotSupported = errors.New("not supported")
	// ErrUnknownContainer: no container of that owner exists in the back end.
	ErrUnknownContainer = errors.New("unknown container")
)
