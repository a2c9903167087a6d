package linux

import "errors"

// ErrNotSupported is returned on operating systems that lack the kernel
// interface asked for.
var ErrNotSupported = errors.New("not supported on this operating system")
