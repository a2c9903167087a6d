//go:build !linux

package linux

import "os"

// MountSizedTmpfs is not supported on this operating system.
func MountSizedTmpfs(string, os.FileMode, uint64, uint64) error { return ErrNotSupported }

// IsMountPoint is not supported on this operating system.
func IsMountPoint(string) (bool, error) { return false, ErrNotSupported }

// UnmountAll is not supported on this operating system.
func UnmountAll(string) error { return ErrNotSupported }

// FreeBytes is not supported on this operating system.
func FreeBytes(string) (uint64, uint64, error) { return 0, 0, ErrNotSupported }
