package linux

import (
	"errors"
	"syscall"
)

// Unreachable reports whether err says that a peer over a socket could not
// be reached or dropped the connection: the socket is missing, refused,
// reset, or its pipe broke.
func Unreachable(err error) bool {
	for _, e := range []syscall.Errno{syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.ENOENT, syscall.EPIPE} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// Busy reports whether err says that the thing is in use (EBUSY).
func Busy(err error) bool { return errors.Is(err, syscall.EBUSY) }
