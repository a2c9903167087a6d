//go:build !linux

package linux

import "os"

// PrivateDir is not supported on this operating system.
func PrivateDir(string, int) error { return ErrNotSupported }

// OpenLockFile is not supported on this operating system.
func OpenLockFile(string, string, int) (*os.File, error) { return nil, ErrNotSupported }
