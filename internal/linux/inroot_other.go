//go:build !linux

package linux

import (
	"io/fs"
	"os"
)

// OpenFileInRoot is not supported on this operating system.
func OpenFileInRoot(string, string) (*os.File, error) { return nil, ErrNotSupported }

// ReadDirInRoot is not supported on this operating system.
func ReadDirInRoot(string, string, int) ([]fs.DirEntry, error) { return nil, ErrNotSupported }
