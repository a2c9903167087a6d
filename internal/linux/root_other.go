//go:build !linux

package linux

import "os"

// Root is not supported on this operating system.
type Root struct{}

// OpenRoot is not supported on this operating system.
func OpenRoot(string) (*Root, error) { return nil, ErrNotSupported }

// Close does nothing here.
func (*Root) Close() error { return nil }

// Bind is not supported on this operating system.
func (*Root) Bind(string, string, bool) error { return ErrNotSupported }

// BindOptions are the flags of a bind mount.
type BindOptions struct {
	ReadOnly, NoSuid, NoDev, NoExec bool
}

// ParseBindOptions is not supported on this operating system.
func ParseBindOptions([]string) BindOptions { return BindOptions{} }

// BindWith is not supported on this operating system.
func (*Root) BindWith(string, string, BindOptions) error { return ErrNotSupported }

// Tmpfs is not supported on this operating system.
func (*Root) Tmpfs(string, os.FileMode) error { return ErrNotSupported }

// StatDevice is not supported on this operating system.
func (*Root) StatDevice(string) (DeviceNumber, error) { return DeviceNumber{}, ErrNotSupported }

// Unbind is not supported on this operating system.
func (*Root) Unbind(string) error { return ErrNotSupported }

// Dir is not supported on this operating system.
func (*Root) Dir(string) error { return ErrNotSupported }

// LoopbackUp is not supported on this operating system.
func LoopbackUp() error { return ErrNotSupported }

// SetHostname is not supported on this operating system.
func SetHostname(string) error { return ErrNotSupported }

// CloseExecFrom is not supported on this operating system.
func CloseExecFrom(int) error { return ErrNotSupported }

// BindMountNoSUID is not supported on this operating system.
func BindMountNoSUID(string, string) error { return ErrNotSupported }

// BindTreeReadOnly is not supported on this operating system.
func BindTreeReadOnly(string, string) error { return ErrNotSupported }
