package mps

import "github.com/gpuiso/gpuiso/node"

var (
	// ErrNoControl: the node has no MPS control daemon binary
	// (nvidia-cuda-mps-control) in PATH or its driver root, so memory
	// shares cannot be enforced on it.
	ErrNoControl = node.Sentinel(node.ErrNotSupported, "no MPS control daemon (nvidia-cuda-mps-control)")
	// ErrNoServer: the node has no MPS server binary
	// (nvidia-cuda-mps-server) beside its control daemon or in its driver
	// root, so a daemon could start no server the manager has made out of
	// its clients' reach; no daemon is started.
	ErrNoServer = node.Sentinel(node.ErrNotSupported, "no MPS server (nvidia-cuda-mps-server)")
	// ErrInvalid: a request to the manager is malformed (an owner id no
	// container can have, a GPU without a UUID, a MIG device named by its
	// parent's UUID, a share
	// of no memory, a compute percentage over 100).
	ErrInvalid = node.Sentinel(node.ErrInvalid, "invalid MPS request")
	// ErrExists: the owner has a running daemon of another GPU or other
	// limits.
	ErrExists = node.Sentinel(node.ErrExists, "owner has another MPS daemon")
	// ErrUnknownOwner: the owner has no daemon.
	ErrUnknownOwner = node.Sentinel(node.ErrNotFound, "no MPS daemon for the owner")
	// ErrDaemon: a daemon did not start, did not take its limits, or
	// does not answer.
	ErrDaemon = node.Sentinel(node.ErrUnavailable, "MPS control daemon failed")
	// ErrTampered: a daemon's pipe directory (its container's to write)
	// holds something other than the daemon's sockets under their names
	// (a link to another socket): no command is sent through it.
	ErrTampered = node.Sentinel(node.ErrUnavailable, "MPS pipe directory tampered with")
	// ErrUnsafeRestart: a dead daemon was to be started again in the
	// directories its share's container may still write, on a kernel that
	// cannot keep the daemon from following links planted there
	// (nosymfollow, Linux 5.10): the share is not restarted.
	ErrUnsafeRestart = node.Sentinel(node.ErrNotSupported, "MPS daemon not restarted under its container: the kernel lacks nosymfollow")
	// ErrLocked: another change of the manager's directory, in this
	// process or another, held it past the lock timeout
	// (WithLockTimeout).
	ErrLocked = node.Sentinel(node.ErrUnavailable, "MPS directory locked by another change")
	// ErrNoManager: a memory share is to be started with no MPS daemon
	// manager (a nil *Manager), so nothing would hold its container to
	// its limits. containerizer.ErrNoMPS is the same value.
	ErrNoManager = node.Sentinel(node.ErrNotSupported, "a memory share needs an MPS daemon manager")
	// ErrNotMade: a Manager not made with New (its zero value).
	ErrNotMade = node.NotMade("MPS manager not made with New")
)
