//go:build !linux

package linux

import "syscall"

// Clone flags have no meaning here.
const (
	CloneNewPID    = 0
	CloneNewCgroup = 0
	CloneNewNet    = 0
	CloneNewIPC    = 0
	CloneNewUTS    = 0
)

// UnshareCgroup is not supported on this operating system.
func UnshareCgroup() error { return ErrNotSupported }

// LimitCapabilities is not supported on this operating system.
func LimitCapabilities([]int) error { return ErrNotSupported }

// SetNoNewPrivs is not supported on this operating system.
func SetNoNewPrivs() error { return ErrNotSupported }

// PivotRoot is not supported on this operating system.
func PivotRoot(string) error { return ErrNotSupported }

// MountProc is not supported on this operating system.
func MountProc(string) error { return ErrNotSupported }

// MountSysfs is not supported on this operating system.
func MountSysfs(string) error { return ErrNotSupported }

// MountCgroup is not supported on this operating system.
func MountCgroup(string, string) error { return ErrNotSupported }

// RemountReadOnly is not supported on this operating system.
func RemountReadOnly(string) error { return ErrNotSupported }

// MaskPath is not supported on this operating system.
func MaskPath(string, string) error { return ErrNotSupported }

// LoadSeccomp is not supported on this operating system.
func LoadSeccomp([]SeccompInstruction) error { return ErrNotSupported }

// InitAttr starts the init in a session of its own: namespaces have no
// meaning here.
func InitAttr(uintptr) *syscall.SysProcAttr { return &syscall.SysProcAttr{Setsid: true} }
