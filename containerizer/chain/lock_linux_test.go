package chain

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"github.com/gpuiso/gpuiso/node"
)

// TestStateDirLockPrivate: the state directory's lock is a 0600 file in a
// 0700 directory (an older release's 0755 directory tightened); a lock
// file or directory that another user owns, or could open, write or
// replace, is refused with an *UnsafeLockError and left as it is.
func TestStateDirLockPrivate(t *testing.T) {
	const stranger = 65534
	tests := []struct {
		name    string
		root    bool // chown needs root
		prepare func(t *testing.T, dir string)
		unsafe  bool
	}{
		{name: "fresh", prepare: func(*testing.T, string) {}},
		{name: "older 0755 directory", prepare: func(t *testing.T, dir string) {
			chmod(t, dir, 0o755)
			writeFile(t, filepath.Join(dir, lockFile), 0o600)
		}},
		{name: "world-writable lock file", unsafe: true, prepare: func(t *testing.T, dir string) {
			writeFile(t, filepath.Join(dir, lockFile), 0o666)
		}},
		{name: "lock file others may read", unsafe: true, prepare: func(t *testing.T, dir string) {
			writeFile(t, filepath.Join(dir, lockFile), 0o644)
		}},
		{name: "world-writable directory", unsafe: true, prepare: func(t *testing.T, dir string) {
			chmod(t, dir, 0o777)
		}},
		{name: "lock file a link", unsafe: true, prepare: func(t *testing.T, dir string) {
			other := filepath.Join(t.TempDir(), "other")
			writeFile(t, other, 0o600)
			if err := os.Symlink(other, filepath.Join(dir, lockFile)); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "stranger's lock file", root: true, unsafe: true, prepare: func(t *testing.T, dir string) {
			path := filepath.Join(dir, lockFile)
			writeFile(t, path, 0o600)
			if err := os.Chown(path, stranger, stranger); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "stranger's directory", root: true, unsafe: true, prepare: func(t *testing.T, dir string) {
			if err := os.Chown(dir, stranger, stranger); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.root && os.Geteuid() != 0 {
				t.Skip("needs root to give a file to another user")
			}
			dir := filepath.Join(t.TempDir(), "state")
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			tt.prepare(t, dir)
			before := listing(t, dir)
			f, err := lockDir(dir)
			if tt.unsafe {
				var ue *UnsafeLockError
				if !errors.Is(err, ErrUnsafeLock) || !errors.Is(err, node.ErrCorrupt) || !errors.As(err, &ue) || ue.Path == "" || ue.Reason == "" {
					if f != nil {
						f.Close()
					}
					t.Fatalf("lockDir = %v, want an *UnsafeLockError", err)
				}
				if after := listing(t, dir); after != before {
					t.Fatalf("refused, but changed:\n%s\n%s", before, after)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			for path, want := range map[string]os.FileMode{dir: os.ModeDir | 0o700, filepath.Join(dir, lockFile): 0o600} {
				if fi, err := os.Lstat(path); err != nil || fi.Mode() != want {
					t.Errorf("%s: %v, %v; want %v", path, fi.Mode(), err, want)
				}
			}
			if _, err := lockDir(dir); !errors.Is(err, ErrInUse) {
				t.Errorf("second lock: %v, want ErrInUse", err)
			}
		})
	}
}

func chmod(t *testing.T, path string, mode os.FileMode) {
	t.Helper()
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

func writeFile(t *testing.T, path string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, nil, mode); err != nil {
		t.Fatal(err)
	}
	chmod(t, path, mode) // past the umask
}

// listing is dir's entries and itself, each with its mode and owner.
func listing(t *testing.T, dir string) string {
	t.Helper()
	var s string
	err := filepath.Walk(dir, func(path string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		s += path + " " + fi.Mode().String() + " " + fileOwner(fi) + "\n"
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func fileOwner(fi os.FileInfo) string {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return strconv.Itoa(int(st.Uid))
	}
	return "?"
}
