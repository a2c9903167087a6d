package allocator

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/gpuiso/gpuiso/internal/linux"
)

// The holder of a state directory's lock names itself in the lock file,
// "<pid>.<start>" padded to holderRecordSize bytes, as soon as it has the
// lock: an allocator that gives up waiting names it in its LockError.
const holderRecordSize = 48

// recordHolder writes this process into the lock file, which the caller
// has just locked. It is best effort: a record that cannot be written only
// leaves the holder unknown to a waiter.
func (s *store) recordHolder() {
	p, err := linux.Self(s.procRoot)
	if err != nil {
		return
	}
	rec := []byte(p.String() + "\n")
	if len(rec) > holderRecordSize {
		return
	}
	rec = append(rec, bytes.Repeat([]byte{' '}, holderRecordSize-len(rec))...)
	_, _ = s.lockFile.WriteAt(rec, 0)
}

// lockError describes a wait for the lock that ended with ctx: the
// process the lock file names, when it still runs.
func (s *store) lockError(ctx context.Context, waitErr error) error {
	cause := context.Cause(ctx)
	if cause == nil {
		cause = waitErr
	}
	e := &LockError{Dir: s.dir, Err: cause}
	buf := make([]byte, holderRecordSize)
	n, _ := s.lockFile.ReadAt(buf, 0)
	if p, err := linux.ParseProcess(strings.TrimSpace(string(buf[:n]))); err == nil && p.Alive(s.procRoot) {
		e.Holder = &Holder{Pid: p.Pid, Start: p.Start}
		e.Command = command(s.procRoot, p.Pid)
	}
	return e
}

// command returns the command name of process pid ("" when unknown).
func command(procRoot string, pid int) string {
	f, err := os.Open(filepath.Join(procRoot, strconv.Itoa(pid), "comm"))
	if err != nil {
		return ""
	}
	defer f.Close()
	b := make([]byte, 64)
	n, _ := f.Read(b)
	return strings.TrimSpace(string(b[:n]))
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
	s.recordHolder()
	return true, nil
}

// tryLockStore takes the lock only if it is free now.
func (s *store) tryLockStore() (locked bool) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // linux.Lock tries once before it looks at ctx
	locked, err := s.lockStore(ctx)
	return err == nil && locked
}
