//go:build !linux

package linux

import (
	"os"
	"os/exec"
)

// NamespaceMount is a mount of a daemon's mount namespace (Linux only).
type NamespaceMount struct {
	Source    string
	Target    string
	Mode      os.FileMode
	Untrusted bool
	Content   *os.File
}

// StartDaemon is not supported on this operating system.
func StartDaemon(*exec.Cmd, []NamespaceMount) error { return ErrNotSupported }

// StartDaemonFrom is not supported on this operating system.
func StartDaemonFrom(*exec.Cmd, string, []NamespaceMount) error { return ErrNotSupported }

// LockHolder is not supported on this operating system.
func LockHolder(string) (int, error) { return 0, ErrNotSupported }

// Signal is not supported on this operating system.
func Signal(int, int) error { return ErrNotSupported }

// Signals Signal sends.
const (
	SignalTerm = 15
)
