//go:build !linux

package linux

import "os"

// StatDevice is not supported on this operating system.
func StatDevice(string) (DeviceNumber, error) { return DeviceNumber{}, ErrNotSupported }

// Mknod is not supported on this operating system.
func Mknod(string, os.FileMode, DeviceNumber) error { return ErrNotSupported }

// FilesystemType is not supported on this operating system.
func FilesystemType(string) (int64, error) { return 0, ErrNotSupported }

// IsRoot reports false: nothing privileged is supported here.
func IsRoot() bool { return false }
