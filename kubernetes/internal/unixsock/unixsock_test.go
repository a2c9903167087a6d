package unixsock_test

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/gpuiso/gpuiso/kubernetes/internal/unixsock"
)

// TestListenMode: whatever the umask, the socket is 0600 as soon as its
// path exists, a stale file there is replaced, a client connects, no
// private directory is left, and Close removes the socket.
func TestListenMode(t *testing.T) {
	for _, umask := range []int{0, 0o022} {
		t.Run(fmt.Sprintf("umask %04o", umask), func(t *testing.T) {
			old := syscall.Umask(umask)
			defer syscall.Umask(old)
			dir := t.TempDir()
			path := filepath.Join(dir, "p.sock")
			if err := os.WriteFile(path, []byte("stale"), 0o666); err != nil {
				t.Fatal(err)
			}
			l, err := unixsock.Listen(t.Context(), path)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			fi, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode() != os.ModeSocket|unixsock.Mode {
				t.Errorf("mode %v, want %v", fi.Mode(), os.ModeSocket|unixsock.Mode)
			}
			go func() {
				if c, err := l.Accept(); err == nil {
					c.Close()
				}
			}()
			c, err := net.Dial("unix", path)
			if err != nil {
				t.Fatal(err)
			}
			c.Close()
			if entries, _ := os.ReadDir(dir); len(entries) != 1 {
				t.Errorf("directory holds %v, want the socket alone", entries)
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Lstat(path); !os.IsNotExist(err) {
				t.Errorf("socket left after Close: %v", err)
			}
			if err := l.Close(); err != nil {
				t.Errorf("second Close: %v", err)
			}
		})
	}
}

// TestListenFails: a directory that does not exist is an error and leaves
// nothing.
func TestListenFails(t *testing.T) {
	if _, err := unixsock.Listen(t.Context(), filepath.Join(t.TempDir(), "none", "p.sock")); err == nil {
		t.Error("listen in a missing directory succeeded")
	}
}
