//go:build !linux

package linux

import (
	"context"
	"io/fs"
	"os"
)

// Lock is not supported on this operating system.
func Lock(context.Context, *os.File) error { return ErrNotSupported }

// Unlock is not supported on this operating system.
func Unlock(*os.File) error { return ErrNotSupported }

// Noexec is not supported on this operating system.
func Noexec(string) (bool, error) { return false, ErrNotSupported }

// MountTmpfs is not supported on this operating system.
func MountTmpfs(string, os.FileMode) error { return ErrNotSupported }

// Unmount is not supported on this operating system.
func Unmount(string) error { return ErrNotSupported }

// Exchange is not supported on this operating system.
func Exchange(string, string) error { return ErrNotSupported }

// Owner cannot tell a file's owner on this operating system.
func Owner(fs.FileInfo) (uint32, bool) { return 0, false }

// Inode cannot tell a file's inode on this operating system.
func Inode(fs.FileInfo) (dev, ino uint64, ok bool) { return 0, 0, false }
