package simnode_test

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
	"github.com/gpuiso/gpuiso/node/simnode"
)

const (
	// childEnv names, for TestMain, the part a re-run test binary plays.
	childEnv = "GPUISO_SIMNODE_CHILD"
	// strangerRootsEnv lists, for strangerChild, the directories to walk.
	strangerRootsEnv = "GPUISO_SIMNODE_STRANGER_ROOTS"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "stranger" {
		strangerChild()
		return
	}
	os.Exit(m.Run())
}

// TestStrangerHoldsNoHostLock: a user who takes a flock on every file and
// directory of a host tree's directory that they can open stalls no
// maker, and can open no lock of the makers.
func TestStrangerHoldsNoHostLock(t *testing.T) {
	testenv.RequireRoot(t)
	sim, err := simnode.New("dgx1-volta")
	if err != nil {
		t.Fatal(err)
	}
	base := strangerVisibleDir(t)
	dir := filepath.Join(base, "host")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// The bound only ends a test that would otherwise hang.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	held := holdAsStranger(t, base)
	if !slices.Contains(held, dir) {
		t.Fatalf("the stranger holds no lock on the tree's directory: %q", held)
	}
	h, err := sim.OpenHost(ctx, dir)
	if err != nil {
		t.Fatalf("OpenHost with a stranger holding %q: %v", held, err)
	}
	for p, want := range map[string]fs.FileMode{
		filepath.Join(dir, simnode.MakeLockDir):                       fs.ModeDir | 0o700,
		filepath.Join(dir, simnode.MakeLockDir, simnode.MakeLockName): 0o600,
	} {
		fi, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode() & (fs.ModeType | fs.ModePerm); got != want {
			t.Errorf("%s: mode %v, want %v", p, got, want)
		}
	}
	// The control: nobody lists the tree's directory.
	cmd := exec.Command("ls", dir)
	cmd.SysProcAttr = nobody()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nobody cannot list %s: %v: %s", dir, err, out)
	}
	lock := filepath.Join(dir, simnode.MakeLockDir, simnode.MakeLockName)
	cmd = exec.Command("flock", "-n", lock, "true")
	cmd.SysProcAttr = nobody()
	if out, err := cmd.CombinedOutput(); err == nil {
		t.Errorf("nobody took the lock %s: %s", lock, out)
	}

	// The tree is found again, and removed whole.
	again, err := sim.OpenHost(ctx, dir)
	if err != nil || again.NVIDIAMajor != h.NVIDIAMajor {
		t.Fatalf("OpenHost again = %+v, %v; want %+v", again, err, h)
	}
	if err := h.Remove(); err != nil {
		t.Fatal(err)
	}
	if names := dirNames(dir); len(names) != 0 {
		t.Errorf("after Remove, %s holds %q", dir, names)
	}
}

// TestHostLockTimeout: a wait for a maker that holds the lock ends, with no
// deadline from the caller, at the timeout in a HostLockError naming the
// holder; the lock left alone is claimed by the next maker and removed by
// Remove.
func TestHostLockTimeout(t *testing.T) {
	testenv.RequireRoot(t)
	sim, err := simnode.New("pcie8")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "host")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := simnode.LockHost(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	_, err = sim.OpenHostWithin(context.Background(), dir, 10*time.Millisecond)
	var le *simnode.HostLockError
	if !errors.As(err, &le) || !errors.Is(err, simnode.ErrHostLocked) || !errors.Is(err, node.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("openHost while locked = %v, want a HostLockError (simnode.ErrHostLocked, node.ErrUnavailable)", err)
	}
	if le.Dir != dir || le.Holder == nil || le.Holder.Pid != os.Getpid() || !strings.Contains(err.Error(), fmt.Sprint("pid ", os.Getpid())) {
		t.Errorf("HostLockError = %+v (%v), want the holder pid %d", le, err, os.Getpid())
	}
	if names := dirNames(dir); !slices.Equal(names, []string{simnode.MakeLockDir}) {
		t.Errorf("after the wait, %s holds %q, want only the lock", dir, names)
	}
	if simnode.IsHostTree(dir) {
		t.Errorf("simnode.IsHostTree(%s) holding only the lock = true", dir)
	}
	if err := (&simnode.Host{Root: dir}).Remove(); err != nil {
		t.Errorf("Remove of a directory holding only the lock: %v", err)
	}
	if names := dirNames(dir); len(names) != 0 {
		t.Errorf("after Remove, %s holds %q", dir, names)
	}
	f.Close() // its file is gone: the next maker locks a new one

	f, err = simnode.LockHost(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	_, err = sim.OpenHostWithin(context.Background(), dir, 10*time.Millisecond)
	if !errors.Is(err, simnode.ErrHostLocked) {
		t.Fatalf("openHost while locked = %v, want simnode.ErrHostLocked", err)
	}
	f.Close()
	h, err := sim.OpenHost(context.Background(), dir)
	if err != nil {
		t.Fatalf("OpenHost after a wait that ended: %v", err)
	}
	if err := h.Remove(); err != nil {
		t.Fatal(err)
	}
}

// TestMakeLockClaimable: a directory holding the makers' lock as gpuiso
// makes it is claimable; one holding a user's .lock.d is not.
func TestMakeLockClaimable(t *testing.T) {
	testenv.RequireRoot(t)
	for name, tc := range map[string]struct {
		mode    fs.FileMode
		file    string
		refused bool
	}{
		"gpuiso's":       {mode: 0o700, file: simnode.MakeLockName},
		"empty":          {mode: 0o700},
		"open to others": {mode: 0o755, file: simnode.MakeLockName, refused: true},
		"holding more":   {mode: 0o700, file: "notes", refused: true},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			lockDir := filepath.Join(dir, simnode.MakeLockDir)
			if err := os.Mkdir(lockDir, tc.mode); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(lockDir, tc.mode); err != nil {
				t.Fatal(err)
			}
			if tc.file != "" {
				if err := os.WriteFile(filepath.Join(lockDir, tc.file), nil, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			err := simnode.Claimable(dir)
			if refused := errors.Is(err, simnode.ErrNotOwned); refused != tc.refused {
				t.Errorf("claimable = %v, want refused %v", err, tc.refused)
			}
			if err := (&simnode.Host{Root: dir}).Remove(); (err != nil) != tc.refused {
				t.Errorf("Remove = %v, want refused %v", err, tc.refused)
			}
		})
	}
}

// nobody runs a process as the user and group nobody, with no other group.
func nobody() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}}
}

// strangerVisibleDir is a new directory, removed when the test ends, that
// nobody may search (t.TempDir's parent is private).
func strangerVisibleDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "simnode-stranger-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// holdAsStranger starts this test binary as nobody, copied where nobody
// can run it, to hold a flock on every file and directory under roots that
// it can open, until the test ends. It returns the paths held.
func holdAsStranger(t *testing.T, roots ...string) []string {
	t.Helper()
	dir := strangerVisibleDir(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "stranger")
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Env = []string{childEnv + "=stranger", strangerRootsEnv + "=" + strings.Join(roots, string(filepath.ListSeparator))}
	cmd.SysProcAttr = nobody()
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
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
