package linux

import "errors"

// ErrNotSupported is returned on operating systems that lack the kernel
// interface asked for.
var ErrNotSupported = errors.New("not supported on this operating system")

// ErrUnknownCapability is returned for a capability name the kernel does not
// define.
var ErrUnknownCapability = errors.New("unknown capability")
