package allocator_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
)

// TestLockFileChecked: the state directory's lock file is opened only when
// no other user could open it, or replace it: one open to others, a link,
// a FIFO, another user's, or one in a directory others may write to is
// refused with an *UnsafeLockError and left as it is. A stranger (nobody)
// can neither take the lock nor read the state.
func TestLockFileChecked(t *testing.T) {
	tests := []struct {
		name    string
		root    bool
		prepare func(t *testing.T, dir, lock string)
		unsafe  bool
	}{
		{"missing", false, func(*testing.T, string, string) {}, false},
		{"directory readable by others", false, func(t *testing.T, dir, _ string) { chmod(t, dir, 0o755) }, false},
		{"older release's", false, func(t *testing.T, _, lock string) { writeFile(t, lock, 0o600) }, false},
		{"readable by others", false, func(t *testing.T, _, lock string) { writeFile(t, lock, 0o644) }, true},
		{"writable by group", false, func(t *testing.T, _, lock string) { writeFile(t, lock, 0o620) }, true},
		{"a symlink", false, func(t *testing.T, dir, lock string) {
			target := filepath.Join(t.TempDir(), "elsewhere")
			writeFile(t, target, 0o600)
			if err := os.Symlink(target, lock); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"a FIFO", false, func(t *testing.T, _, lock string) {
			if err := syscall.Mkfifo(lock, 0o600); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"directory writable by others", false, func(t *testing.T, dir, _ string) { chmod(t, dir, 0o777) }, true},
		{"another user's", true, func(t *testing.T, _, lock string) {
			writeFile(t, lock, 0o600)
			if err := os.Chown(lock, 65534, 65534); err != nil {
				t.Fatal(err)
			}
		}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.root {
				testenv.RequireRoot(t)
			}
			dir := filepath.Join(t.TempDir(), "state")
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			lock := filepath.Join(dir, allocator.LockFile)
			tt.prepare(t, dir, lock)
			before := listDir(t, dir)
			a, err := allocator.New(simInv(t, "dgx1-volta"), allocator.WithStateDir(dir))
			if !tt.unsafe {
				if err != nil {
					t.Fatal(err)
				}
				a.Close()
				if fi, err := os.Lstat(lock); err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o077 != 0 {
					t.Fatalf("lock file %v, %v; want a regular file no one else may open", fi, err)
				}
				return
			}
			var ue *allocator.UnsafeLockError
			if !errors.Is(err, allocator.ErrUnsafeLock) || !errors.As(err, &ue) {
				if err == nil {
					a.Close()
				}
				t.Fatalf("New = %v, want an *UnsafeLockError", err)
			}
			if after := listDir(t, dir); after != before {
				t.Fatalf("refused, but changed:\n%s\n%s", before, after)
			}
		})
	}
	t.Run("a stranger", func(t *testing.T) {
		testenv.RequireRoot(t)
		// A state directory others may enter, under directories they may.
		base, err := os.MkdirTemp("", "allocator-stranger-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(base) })
		chmod(t, base, 0o755)
		dir := filepath.Join(base, "state")
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		chmod(t, dir, 0o755)
		a := newAlloc(t, "dgx1-volta", allocator.WithStateDir(dir))
		defer a.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := a.Allocate(ctx, "task-1", allocator.Request{Count: 1}); err != nil {
			t.Fatal(err)
		}
		for _, args := range [][]string{
			{"ls", dir}, // the control: nobody enters the directory
			{"flock", "-n", filepath.Join(dir, allocator.LockFile), "true"},
			{"cat", filepath.Join(dir, allocator.StateFile)},
		} {
			cmd := exec.Command(args[0], args[1:]...)
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}}
			out, err := cmd.CombinedOutput()
			if control := args[0] == "ls"; control != (err == nil) {
				t.Errorf("nobody ran %q: %v: %s", args, err, out)
			}
		}
	})
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
	chmod(t, path, mode)
}

// listDir lists dir's entries with their modes.
func listDir(t *testing.T, dir string) string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s %v %d\n", e.Name(), fi.Mode(), fi.Size())
	}
	return b.String()
}
