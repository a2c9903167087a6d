//go:build !linux

package linux

import "os"

// OpenSocketPath is not supported on this operating system.
func OpenSocketPath(string, string) (*os.File, error) { return nil, ErrNotSupported }
