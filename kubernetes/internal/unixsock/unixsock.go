// Package unixsock makes the plugin's Unix sockets: each is its owner's
// alone (mode 0600) from the moment it can be connected to, whatever the
// process's umask.
//
// A socket bound in place gets 0777 less the umask, and a chmod after the
// bind leaves a moment in which anyone may connect. Listen binds it in a
// private directory (0700) made next to its path, sets its mode there and
// renames it into place; a client connecting by the path reaches it only
// after the rename. The kubelet's watchers ignore the directory: its name
// starts with a dot.
package unixsock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
)

// Mode is the sockets' mode.
const Mode os.FileMode = 0o600

// Listen listens on a Unix socket at path with mode Mode, replacing a
// file already there (a stale socket). Closing the listener removes the
// socket.
func Listen(ctx context.Context, path string) (net.Listener, error) {
	dir, err := os.MkdirTemp(filepath.Dir(path), ".s")
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	defer os.RemoveAll(dir)
	tmp := filepath.Join(dir, "s")
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, "unix", tmp)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	ul := l.(*net.UnixListener)
	// Its name is about to change: the listener removes it by its path.
	ul.SetUnlinkOnClose(false)
	if err := os.Chmod(tmp, Mode); err != nil {
		ul.Close()
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		ul.Close()
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	return &listener{UnixListener: ul, path: path}, nil
}

// listener removes its socket when closed.
type listener struct {
	*net.UnixListener
	path string
	once sync.Once
	err  error
}

// Close stops listening and removes the socket, once.
func (l *listener) Close() error {
	l.once.Do(func() {
		l.err = l.UnixListener.Close()
		if err := os.Remove(l.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			l.err = errors.Join(l.err, err)
		}
	})
	return l.err
}
