//go:build !linux

package linux

import "os"

// MknodAt is not supported on this operating system.
func MknodAt(*os.File, string, os.FileMode, DeviceNumber) error { return ErrNotSupported }
