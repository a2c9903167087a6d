package simnode

import (
	"context"
	"os"
	"time"
)

// The makers' lock of a host tree, for the external tests.
const (
	MakeLockDir  = makeLockDir
	MakeLockName = makeLockName
)

// Claimable is claimable, for the external tests.
var Claimable = claimable

// LockHost takes the makers' lock of dir as OpenHost takes it.
func LockHost(ctx context.Context, dir string) (*os.File, error) {
	return lockHost(ctx, dir, time.Minute)
}

// OpenHostWithin is OpenHost waiting for the lock no longer than timeout.
func (n *Node) OpenHostWithin(ctx context.Context, dir string, timeout time.Duration) (*Host, error) {
	return n.openHost(ctx, dir, timeout)
}
