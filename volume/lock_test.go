package volume

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/node"
)

// TestLockFile: the root's lock is a 0600 file in a 0700 directory; an
// older release's 0755 lock directory is tightened; a lock file others
// could open, or a link, is refused with an *UnsafeError and left as it is.
func TestLockFile(t *testing.T) {
	const v = "535.309.01"
	tests := []struct {
		name    string
		prepare func(t *testing.T, dir string)
		unsafe  bool
	}{
		{"missing", func(*testing.T, string) {}, false},
		{"directory 0755", func(t *testing.T, dir string) { must(t, os.Mkdir(dir, 0o700)); must(t, os.Chmod(dir, 0o755)) }, false},
		{"directory writable by others", func(t *testing.T, dir string) { must(t, os.Mkdir(dir, 0o700)); must(t, os.Chmod(dir, 0o777)) }, true},
		{"directory a symlink", func(t *testing.T, dir string) { must(t, os.Symlink(t.TempDir(), dir)) }, true},
		{"file readable by others", func(t *testing.T, dir string) {
			must(t, os.Mkdir(dir, 0o700))
			must(t, os.WriteFile(filepath.Join(dir, lockName), nil, 0o644))
			must(t, os.Chmod(filepath.Join(dir, lockName), 0o644))
		}, true},
		{"file a symlink", func(t *testing.T, dir string) {
			must(t, os.Mkdir(dir, 0o700))
			target := filepath.Join(t.TempDir(), "elsewhere")
			must(t, os.WriteFile(target, nil, 0o600))
			must(t, os.Symlink(target, filepath.Join(dir, lockName)))
		}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := driverTree(t, v).manager()
			must(t, os.MkdirAll(m.Root(), 0o755))
			dir := filepath.Join(m.Root(), lockDir)
			tt.prepare(t, dir)
			before := listTree(t, m.Root())
			_, err := m.Build(context.Background())
			if tt.unsafe {
				var ue *UnsafeError
				if !errors.Is(err, ErrUnsafe) || !errors.As(err, &ue) {
					t.Fatalf("Build = %v, want an *UnsafeError", err)
				}
				if after := listTree(t, m.Root()); !slices.Equal(before, after) {
					t.Fatalf("refused Build changed the root:\n%q\n%q", before, after)
				}
				return
			}
			must(t, err)
			for p, want := range map[string]fs.FileMode{dir: fs.ModeDir | 0o700, filepath.Join(dir, lockName): 0o600} {
				if fi, err := os.Lstat(p); err != nil {
					t.Error(err)
				} else if fi.Mode() != want {
					t.Errorf("%s: %v, want %v", p, fi.Mode(), want)
				}
			}
		})
	}
}

// TestUsersPrivate: the users' records are 0700 directories and 0600
// files; those an older release left open to others are replaced by
// private copies, so that a listing opened before sees none of them.
func TestUsersPrivate(t *testing.T) {
	const v = "535.309.01"
	ctx := context.Background()
	m := driverTree(t, v).manager()
	_, err := m.Build(ctx)
	must(t, err)
	must(t, m.Acquire(ctx, v, "c1"))
	udir := filepath.Join(m.Root(), usersDir)
	expectPrivate := func(t *testing.T) {
		t.Helper()
		must(t, filepath.WalkDir(udir, func(p string, d fs.DirEntry, err error) error {
			must(t, err)
			fi, err := d.Info()
			must(t, err)
			want := fs.FileMode(0o600)
			if d.IsDir() {
				want = fs.ModeDir | 0o700
			}
			if fi.Mode() != want {
				t.Errorf("%s: %v, want %v", p, fi.Mode(), want)
			}
			return nil
		}))
	}
	expectPrivate(t)

	// As an older release left them.
	must(t, os.Chmod(udir, 0o755))
	must(t, os.Chmod(filepath.Join(udir, v), 0o755))
	must(t, os.Chmod(filepath.Join(udir, v, "c1"), 0o644))
	must(t, os.WriteFile(filepath.Join(udir, v, "c0"), nil, 0o644))
	old, err := os.Open(filepath.Join(udir, v))
	must(t, err)
	defer old.Close()
	vols, err := m.List(ctx)
	must(t, err)
	if got := fmt.Sprint(volumeSummary(vols)); got != "[535.309.01:[c0 c1]]" {
		t.Fatalf("List = %s, want the users kept", got)
	}
	expectPrivate(t)
	if names, _ := old.Readdirnames(-1); len(names) != 0 {
		t.Fatalf("the old users directory, opened before, still lists %q", names)
	}
	// Nothing of the copy is left behind.
	assertOnlyVolumes(t, m.Root(), "nvidia_"+v)
}

// TestLockTimeoutNamesHolder: a wait for the root's lock ends at the
// manager's lock timeout with a *LockError naming the process that holds
// it, even when the caller's context has no deadline.
func TestLockTimeoutNamesHolder(t *testing.T) {
	root := filepath.Join(t.TempDir(), "volumes")
	holder, err := New(WithRoot(root))
	must(t, err)
	unlock, err := holder.lock(context.Background())
	must(t, err)
	defer unlock()
	if _, err := New(WithLockTimeout(0)); !errors.Is(err, node.ErrInvalid) {
		t.Fatalf("New(WithLockTimeout(0)) = %v, want node.ErrInvalid", err)
	}
	waiter, err := New(WithRoot(root), WithLockTimeout(20*time.Millisecond))
	must(t, err)
	// The context's deadline is only there to end the test should the
	// manager's own not hold.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err = waiter.List(ctx)
	var le *LockError
	if !errors.As(err, &le) || !errors.Is(err, ErrLocked) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("List while locked = %v, want a *LockError", err)
	}
	if le.Holder == nil || le.Holder.Pid != os.Getpid() || le.Command == "" || !strings.Contains(err.Error(), fmt.Sprintf("pid %d (", os.Getpid())) {
		t.Fatalf("LockError %v names %+v %q, want this process", err, le.Holder, le.Command)
	}
}

// TestStrangerHoldsNothing: a user who takes a flock on every file and
// directory under the root that they can open stalls no manager, and can
// open no lock file and list no user of a volume.
func TestStrangerHoldsNothing(t *testing.T) {
	testenv.RequireRoot(t)
	const v = "535.309.01"
	base, err := os.MkdirTemp("", "volume-stranger-")
	must(t, err)
	t.Cleanup(func() { os.RemoveAll(base) })
	must(t, os.Chmod(base, 0o755))
	root := filepath.Join(base, "volumes")
	m := driverTree(t, v).manager(WithRoot(root))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = m.Build(ctx)
	must(t, err)
	must(t, m.Acquire(ctx, v, "c1"))

	held := holdAsStranger(t, base)
	if !slices.Contains(held, root) {
		t.Fatalf("the stranger holds no lock on the root: %q", held)
	}
	_, err = m.Build(ctx)
	must(t, err)
	must(t, m.Acquire(ctx, v, "c2"))
	must(t, m.Release(ctx, v, "c1"))
	vols, err := m.List(ctx)
	must(t, err)
	if got := fmt.Sprint(volumeSummary(vols)); got != "[535.309.01:[c2]]" {
		t.Fatalf("List = %s", got)
	}
	_, err = m.GC(ctx)
	must(t, err)

	if _, err := exec.LookPath("flock"); err != nil {
		t.Fatalf("no flock command to try the lock as nobody: %v", err)
	}
	lock := filepath.Join(root, lockDir, lockName)
	// The control: nobody lists the root.
	cmd := exec.Command("ls", root)
	cmd.SysProcAttr = nobody()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nobody cannot list %s: %v: %s", root, err, out)
	}
	for _, args := range [][]string{
		{"flock", "-n", lock, "true"},
		{"ls", filepath.Join(root, usersDir)},
		{"ls", filepath.Join(root, usersDir, v)},
		{"cat", filepath.Join(root, usersDir, v, "c2")},
	} {
		cmd := exec.Command(args[0], args[1:]...)
		cmd.SysProcAttr = nobody()
		if out, err := cmd.CombinedOutput(); err == nil {
			t.Errorf("nobody ran %q: %s", args, out)
		}
	}
}

// strangerRootsEnv lists, for strangerChild, the directories to walk.
const strangerRootsEnv = "GPUISO_VOLUME_STRANGER_ROOTS"

// nobody runs a process as the user and group nobody, with no other group.
func nobody() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}}
}

// holdAsStranger starts this test binary as nobody, copied where nobody
// can run it, to hold a flock on every file and directory under roots that
// it can open, until the test ends. It returns the paths held.
func holdAsStranger(t *testing.T, roots ...string) []string {
	t.Helper()
	dir, err := os.MkdirTemp("", "volume-stranger-bin-")
	must(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	must(t, os.Chmod(dir, 0o755))
	exe, err := os.Executable()
	must(t, err)
	b, err := os.ReadFile(exe)
	must(t, err)
	bin := filepath.Join(dir, "stranger")
	must(t, os.WriteFile(bin, b, 0o755))
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Env = []string{childEnv + "=stranger", strangerRootsEnv + "=" + strings.Join(roots, string(filepath.ListSeparator))}
	cmd.SysProcAttr = nobody()
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	must(t, err)
	out, err := cmd.StdoutPipe()
	must(t, err)
	must(t, cmd.Start())
	t.Cleanup(func() { in.Close(); cmd.Wait() })
	var held []string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if p, ok := strings.CutPrefix(sc.Text(), "held "); ok {
			held = append(held, p)
		} else if strings.HasPrefix(sc.Text(), "holding ") {
			return held
		}
	}
	t.Fatalf("the stranger ended before holding: %v", sc.Err())
	return nil
}

// strangerChild takes an exclusive flock on every regular file and
// directory it can open under the roots strangerRootsEnv lists, prints
// "held PATH" for each and then "holding N", and keeps them until its
// stdin closes.
func strangerChild() {
	var held []*os.File
	for _, root := range filepath.SplitList(os.Getenv(strangerRootsEnv)) {
		filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil || (!d.IsDir() && !d.Type().IsRegular()) {
				return nil
			}
			f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK, 0)
			if err != nil {
				f, err = os.OpenFile(p, os.O_WRONLY|syscall.O_NONBLOCK, 0)
			}
			if err != nil {
				return nil
			}
			if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
				f.Close()
				return nil
			}
			held = append(held, f)
			fmt.Println("held", p)
			return nil
		})
	}
	fmt.Println("holding", len(held))
	io.Copy(io.Discard, os.Stdin)
}
