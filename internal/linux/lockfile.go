package linux

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/gpuiso/gpuiso/node"
)

// ErrUnsafeLock is returned for a lock file, or the directory holding one,
// that someone other than its owner could open or replace: a symbolic
// link, not a regular file (or not a directory), another user's, or open to
// group or others. Such a lock is never taken, and nothing is changed.
var ErrUnsafeLock = node.Sentinel(node.ErrCorrupt, "unsafe lock file")

// UnsafeLockError is a lock file or lock directory refused, and why.
type UnsafeLockError struct {
	Path   string
	Reason string
}

func (e *UnsafeLockError) Error() string {
	return fmt.Sprintf("lock %s: %s: %s", e.Path, e.Reason, ErrUnsafeLock)
}

// Is matches ErrUnsafeLock and node.ErrCorrupt.
func (e *UnsafeLockError) Is(target error) bool {
	return target == ErrUnsafeLock || target == node.ErrCorrupt
}

// holderRecordSize is the size of the record a lock's holder writes at the
// start of its lock file: "<pid>.<start>\n" padded with spaces.
const holderRecordSize = 48

// RecordHolder writes the calling process, as procRoot shows it, at the
// start of the lock file f, whose lock the caller has just taken, for a
// waiter to name it (see [RecordedHolder]). It is best effort: a record that
// cannot be written only leaves the holder unknown.
func RecordHolder(f *os.File, procRoot string) {
	p, err := Self(procRoot)
	if err != nil {
		return
	}
	rec := []byte(p.String() + "\n")
	if len(rec) > holderRecordSize {
		return
	}
	rec = append(rec, bytes.Repeat([]byte{' '}, holderRecordSize-len(rec))...)
	_, _ = f.WriteAt(rec, 0)
}

// RecordedHolder returns the process the lock file f names as its holder
// ([RecordHolder]) and its command name ("" when unknown); ok is false when
// it names none or the process no longer runs.
func RecordedHolder(f *os.File, procRoot string) (p Process, command string, ok bool) {
	buf := make([]byte, holderRecordSize)
	n, _ := f.ReadAt(buf, 0)
	p, err := ParseProcess(strings.TrimSpace(string(buf[:n])))
	if err != nil || !Alive(procRoot, p) {
		return Process{}, "", false
	}
	return p, Command(procRoot, p.Pid), true
}

// Command returns the command name of process pid (/proc/<pid>/comm), ""
// when unknown.
func Command(procRoot string, pid int) string {
	f, err := os.Open(filepath.Join(procRoot, strconv.Itoa(pid), "comm"))
	if err != nil {
		return ""
	}
	defer f.Close()
	b := make([]byte, 64)
	n, _ := f.Read(b)
	return strings.TrimSpace(string(b[:n]))
}
