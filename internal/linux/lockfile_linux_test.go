package linux

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestOpenLockFile: a missing lock file is made 0600; one that others could
// open or replace (or that is no regular file) is refused and left as it
// is, as is a directory others may write to.
func TestOpenLockFile(t *testing.T) {
	uid := os.Geteuid()
	tests := []struct {
		name    string
		prepare func(t *testing.T, dir, path string)
		unsafe  bool
	}{
		{"missing", func(*testing.T, string, string) {}, false},
		{"private", func(t *testing.T, _, path string) { writeMode(t, path, 0o600) }, false},
		{"read-only to its owner", func(t *testing.T, _, path string) { writeMode(t, path, 0o400) }, false},
		{"in a directory others may read", func(t *testing.T, dir, _ string) { chmod(t, dir, 0o755) }, false},
		{"readable by others", func(t *testing.T, _, path string) { writeMode(t, path, 0o644) }, true},
		{"writable by group", func(t *testing.T, _, path string) { writeMode(t, path, 0o620) }, true},
		{"a symlink", func(t *testing.T, dir, path string) {
			target := filepath.Join(dir, "target")
			writeMode(t, target, 0o600)
			if err := os.Symlink(target, path); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"a dangling symlink", func(t *testing.T, dir, path string) {
			if err := os.Symlink(filepath.Join(dir, "nothing"), path); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"a FIFO", func(t *testing.T, _, path string) {
			if err := unix.Mkfifo(path, 0o600); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"a directory", func(t *testing.T, _, path string) {
			if err := os.Mkdir(path, 0o700); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"directory writable by others", func(t *testing.T, dir, _ string) { chmod(t, dir, 0o777) }, true},
		{"directory writable by group", func(t *testing.T, dir, path string) { writeMode(t, path, 0o600); chmod(t, dir, 0o770) }, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "locks")
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, "x.lock")
			tt.prepare(t, dir, path)
			before := tree(t, dir)
			f, err := OpenLockFile(dir, "x.lock", uid)
			if tt.unsafe {
				var ue *UnsafeLockError
				if !errors.Is(err, ErrUnsafeLock) || !errors.As(err, &ue) {
					t.Fatalf("OpenLockFile = %v, want an *UnsafeLockError", err)
				}
				if after := tree(t, dir); after != before {
					t.Fatalf("refused, but changed:\n%s\n%s", before, after)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			fi, err := os.Lstat(path)
			if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o077 != 0 {
				t.Fatalf("lock file %v, %v; want a regular file no one else may open", fi.Mode(), err)
			}
			if err := Lock(t.Context(), f); err != nil {
				t.Fatal(err)
			}
			RecordHolder(f, "/proc")
			if p, _, ok := RecordedHolder(f, "/proc"); !ok || p.Pid != os.Getpid() {
				t.Fatalf("recorded holder %v, %v; want this process", p, ok)
			}
		})
	}
	t.Run("another user's", func(t *testing.T) {
		if !IsRoot() {
			t.Skip("needs root: chown")
		}
		dir := t.TempDir()
		path := filepath.Join(dir, "x.lock")
		writeMode(t, path, 0o600)
		if err := os.Chown(path, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		if _, err := OpenLockFile(dir, "x.lock", uid); !errors.Is(err, ErrUnsafeLock) {
			t.Fatalf("OpenLockFile of nobody's file = %v, want ErrUnsafeLock", err)
		}
		if _, err := OpenLockFile(dir, "x.lock", 65534); !errors.Is(err, ErrUnsafeLock) {
			t.Fatalf("OpenLockFile in a directory of another owner = %v, want ErrUnsafeLock", err)
		}
	})
}

// TestPrivateDir: a missing directory is made 0700, an older release's
// 0755 one tightened; one others may write to, or a link, is refused.
func TestPrivateDir(t *testing.T) {
	tests := []struct {
		name    string
		prepare func(t *testing.T, dir string)
		unsafe  bool
	}{
		{"missing", func(*testing.T, string) {}, false},
		{"0755", func(t *testing.T, dir string) { mkdirMode(t, dir, 0o755) }, false},
		{"0711", func(t *testing.T, dir string) { mkdirMode(t, dir, 0o711) }, false},
		{"0777", func(t *testing.T, dir string) { mkdirMode(t, dir, 0o777) }, true},
		{"sticky 1777", func(t *testing.T, dir string) { mkdirMode(t, dir, os.ModeSticky|0o777) }, true},
		{"a symlink", func(t *testing.T, dir string) {
			target := dir + "-target"
			mkdirMode(t, target, 0o700)
			if err := os.Symlink(target, dir); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"a file", func(t *testing.T, dir string) { writeMode(t, dir, 0o600) }, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "private")
			tt.prepare(t, dir)
			before := tree(t, filepath.Dir(dir))
			err := PrivateDir(dir, os.Geteuid())
			if tt.unsafe {
				if !errors.Is(err, ErrUnsafeLock) {
					t.Fatalf("PrivateDir = %v, want ErrUnsafeLock", err)
				}
				if after := tree(t, filepath.Dir(dir)); after != before {
					t.Fatalf("refused, but changed:\n%s\n%s", before, after)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if fi, err := os.Lstat(dir); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
				t.Fatalf("directory %v, %v; want 0700", fi.Mode(), err)
			}
		})
	}
}

// TestLockFileStranger: the user nobody can neither open a lock file (so
// take its lock) nor list the private directory it is in, even where
// others may enter the directories above.
func TestLockFileStranger(t *testing.T) {
	if !IsRoot() {
		t.Skip("needs root: runs a process as nobody")
	}
	base, err := os.MkdirTemp("", "lockfile-stranger-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	chmod(t, base, 0o755)
	open := filepath.Join(base, "open")
	writeMode(t, open, 0o644)
	locks := filepath.Join(base, "locks")
	mkdirMode(t, locks, 0o755) // as an older release left it
	if err := PrivateDir(locks, 0); err != nil {
		t.Fatal(err)
	}
	f, err := OpenLockFile(locks, "x.lock", 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	// The control: nobody reads a file open to others beside them.
	if out, err := asNobody("cat", open); err != nil {
		t.Fatalf("nobody cannot read %s: %v: %s", open, err, out)
	}
	for _, args := range [][]string{
		{"flock", "-n", filepath.Join(locks, "x.lock"), "true"},
		{"sh", "-c", "exec 3>>" + filepath.Join(locks, "x.lock")},
		{"ls", locks},
	} {
		if out, err := asNobody(args...); err == nil {
			t.Errorf("nobody ran %q: %s", args, out)
		}
	}
}

// asNobody runs args as the user and group nobody (65534), without
// supplementary groups.
func asNobody(args ...string) (string, error) {
	cmd := exec.Command(args[0], args[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}}
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

func writeMode(t *testing.T, path string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, nil, mode); err != nil {
		t.Fatal(err)
	}
	chmod(t, path, mode)
}

func mkdirMode(t *testing.T, path string, mode os.FileMode) {
	t.Helper()
	if err := os.Mkdir(path, 0o700); err != nil {
		t.Fatal(err)
	}
	chmod(t, path, mode)
}

func chmod(t *testing.T, path string, mode os.FileMode) {
	t.Helper()
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

// tree lists what is under dir with modes, links not followed.
func tree(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		b.WriteString(p + " " + fi.Mode().String() + "\n")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}
