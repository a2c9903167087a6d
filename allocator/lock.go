package allocator

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/node"
)

// ErrUnsafeLock: the state directory's lock file could be opened by
// another user (and its lock taken), or replaced: it is not a regular file
// of the allocator's user with no permission for group or others, or the
// directory is another user's or writable by group or others. See
// UnsafeLockError.
var ErrUnsafeLock = node.Sentinel(node.ErrCorrupt, "unsafe state directory lock")

// UnsafeLockError is a lock file, or state directory, the allocator
// refuses. It never replaces or changes such a file on its own: another
// user may hold it open, and its lock with it, whatever its mode becomes;
// whoever runs the allocators removes it while none runs.
type UnsafeLockError struct {
	// Path is the lock file or the state directory.
	Path string
	// Reason says what is wrong with it.
	Reason string
}

func (e *UnsafeLockError) Error() string {
	return fmt.Sprintf("%s: %s: %s", e.Path, e.Reason, ErrUnsafeLock)
}

// Is makes errors.Is(err, ErrUnsafeLock) hold.
func (e *UnsafeLockError) Is(target error) bool {
	return target == ErrUnsafeLock || target == node.ErrCorrupt
}

// openLockFile opens the lock file of the state directory dir, making it
// (mode 0600) when it is missing: a regular file of this process's user
// that no other user can open, in a directory of that user's that no
// other user may write to (others may read it). Where this is not checked
// (other systems) the file is opened as it is.
func openLockFile(dir string) (*os.File, error) {
	f, err := linux.OpenLockFile(dir, LockFile, os.Geteuid())
	if errors.Is(err, linux.ErrNotSupported) {
		return os.OpenFile(filepath.Join(dir, LockFile), os.O_RDWR|os.O_CREATE, 0o600)
	}
	var ue *linux.UnsafeLockError
	if errors.As(err, &ue) {
		return nil, &UnsafeLockError{Path: ue.Path, Reason: ue.Reason}
	}
	return f, err
}

// The holder of a state directory's lock names itself in the lock file,
// "<pid>.<start>" at its start (linux.RecordHolder), as soon as it has the
// lock: an allocator that gives up waiting names it in its LockError.

// lockError describes a wait for the lock that ended with ctx: the
// process the lock file names, when it still runs.
func (s *store) lockError(ctx context.Context, waitErr error) error {
	cause := context.Cause(ctx)
	if cause == nil {
		cause = waitErr
	}
	e := &LockError{Dir: s.dir, Err: cause}
	if p, command, ok := linux.RecordedHolder(s.lockFile, s.procRoot); ok {
		e.Holder = &p
		e.Command = command
	}
	return e
}

// lockStore takes the state directory's lock, waiting no longer than ctx:
// a wait that ctx ends is a *LockError naming the holder. Where flock is
// not available (other systems) it reports locked false and no error.
func (s *store) lockStore(ctx context.Context) (locked bool, err error) {
	if err := linux.Lock(ctx, s.lockFile); err != nil {
		if errors.Is(err, linux.ErrNotSupported) {
			return false, nil
		}
		if ctx.Err() != nil {
			return false, s.lockError(ctx, err)
		}
		return false, fmt.Errorf("lock state directory: %w", err)
	}
	linux.RecordHolder(s.lockFile, s.procRoot)
	return true, nil
}

// tryLockStore takes the lock only if it is free now.
func (s *store) tryLockStore() (locked bool) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // linux.Lock tries once before it looks at ctx
	locked, err := s.lockStore(ctx)
	return err == nil && locked
}
