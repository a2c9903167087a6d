package linux

import "github.com/gpuiso/gpuiso/node"

// ErrNotSupported is returned on operating systems that lack the kernel
// interface asked for.
var ErrNotSupported = node.Sentinel(node.ErrNotSupported, "not supported on this operating system")

// ErrUnknownCapability is returned for a capability name the kernel does not
// define.
var ErrUnknownCapability = node.Sentinel(node.ErrInvalid, "unknown capability")

// ErrNotDirectory is returned for a mount point inside a root file system
// that is not a directory of that root (a link, say).
var ErrNotDirectory = node.Sentinel(node.ErrInvalid, "not a directory of the root")

// ErrInvalidProcess is returned for a process name that is not
// "<pid>.<start>". It is node.ErrInvalidProcess.
var ErrInvalidProcess = node.ErrInvalidProcess

// ErrNotRegular is returned for a file of a root file system that is not a
// regular file where one is read (a FIFO, a device, a socket, a directory,
// a symbolic link in the last component). Such a file is never opened.
var ErrNotRegular = node.Sentinel(node.ErrInvalid, "not a regular file")

// ErrStillRuns is returned for a process that was to end and did not
// within its bound.
var ErrStillRuns = node.Sentinel(node.ErrUnavailable, "process still runs")
