package node

import (
	"fmt"
	"strconv"
	"strings"
)

// ErrInvalidProcess: a process name is not "<pid>.<start>" (see
// ParseProcess).
var ErrInvalidProcess = Sentinel(ErrInvalid, "invalid process name")

// Process names one process for as long as the node runs: its pid and its
// start time (field 22 of /proc/<pid>/stat, clock ticks since boot), which
// tells it from a later process given the same pid. It is the one process
// identity of the module: the allocator's holders (allocator.Holder is an
// alias of it), the supervisors Docker containers are labelled with, and
// the claim and temporary directories of the native runtime, of the MPS
// managers and of the programs, which name processes in its text form,
// "<pid>.<start>".
//
// Whether a process still runs is a question for the proc file system,
// which this package does not read: the module asks it in one place
// (internal/linux's Alive and Dead); allocator.HolderDead answers it for
// importers.
type Process struct {
	Pid   int    `json:"pid"`
	Start uint64 `json:"start"`
}

// Valid reports whether p can name a process: a positive pid and a start
// time.
func (p Process) Valid() bool { return p.Pid > 0 && p.Start > 0 }

// String is p's text form, "<pid>.<start>", as ParseProcess reads it.
func (p Process) String() string {
	return strconv.Itoa(p.Pid) + "." + strconv.FormatUint(p.Start, 10)
}

// ParseProcess reads "<pid>.<start>" as Process.String writes it. Anything
// else, or a process that is not Valid, is an error matching
// ErrInvalidProcess.
func ParseProcess(s string) (Process, error) {
	pid, start, ok := strings.Cut(s, ".")
	p, err1 := strconv.Atoi(pid)
	st, err2 := strconv.ParseUint(start, 10, 64)
	proc := Process{Pid: p, Start: st}
	if !ok || err1 != nil || err2 != nil || !proc.Valid() || proc.String() != s {
		return Process{}, fmt.Errorf("process %q: want <pid>.<start>: %w", s, ErrInvalidProcess)
	}
	return proc, nil
}
