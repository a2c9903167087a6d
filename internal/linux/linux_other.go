//go:build !linux

package linux

import (
	"errors"
	"os"
)

// StatDevice is not supported on this operating system.
func StatDevice(string) (DeviceNumber, error) { return DeviceNumber{}, ErrNotSupported }

// Mknod is not supported on this operating system.
func Mknod(string, os.FileMode, DeviceNumber) error { return ErrNotSupported }

// FilesystemType is not supported on this operating system.
func FilesystemType(string) (int64, error) { return 0, ErrNotSupported }

// IsRoot reports false: nothing privileged is supported here.
func IsRoot() bool { return false }

// BPFFAllowMulti has no meaning here.
const BPFFAllowMulti = 0

// ErrNoXattr is returned by GetXattr when the attribute is not set.
var ErrNoXattr = errors.New("no such extended attribute")

// SetXattr is not supported on this operating system.
func SetXattr(string, string, []byte) error { return ErrNotSupported }

// GetXattr is not supported on this operating system.
func GetXattr(string, string) ([]byte, error) { return nil, ErrNotSupported }

// MountDevTmpfs is not supported on this operating system.
func MountDevTmpfs(string) error { return ErrNotSupported }

// MakeRSlave is not supported on this operating system.
func MakeRSlave(string) error { return ErrNotSupported }

// MakeRPrivate is not supported on this operating system.
func MakeRPrivate(string) error { return ErrNotSupported }

// BindMount is not supported on this operating system.
func BindMount(string, string, bool) error { return ErrNotSupported }

// MountDevpts is not supported on this operating system.
func MountDevpts(string) error { return ErrNotSupported }

// DetachUnmount is not supported on this operating system.
func DetachUnmount(string) error { return ErrNotSupported }

// CloneNewNS has no meaning here.
const CloneNewNS = 0

// MakeShared is not supported on this operating system.
func MakeShared(string) error { return ErrNotSupported }

// Kill is not supported on this operating system.
func Kill(int) error { return ErrNotSupported }
