package mps_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/isolator/mps"
	"github.com/gpuiso/gpuiso/node"
)

// fill writes zeros into a new file of dir until the write fails or want
// bytes are written, and returns how much it wrote and the error.
func fill(dir string, want int64) (int64, error) {
	f, err := os.Create(filepath.Join(dir, "fill"))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	var n int64
	for n < want {
		k, err := f.Write(buf)
		n += int64(k)
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// freeBytes is what statfs says is free for dir's file system.
func freeBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bavail) * st.Bsize
}

// mountedUnder lists the mount points of this process's namespace under
// dir.
func mountedUnder(t *testing.T, dir string) []string {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) > 4 && (fields[4] == dir || strings.HasPrefix(fields[4], dir+"/")) {
			out = append(out, fields[4])
		}
	}
	return out
}

// TestShareDirsBounded: a share's /dev/shm and pipe directory are tmpfs
// mounts of their own: writing 3 GiB into either stops with ENOSPC at its
// size (DefaultShmBytes for /dev/shm, WithPipeSize's for the pipe
// directory), and the disk of the manager's directory does not grow by
// it. A dead daemon started again keeps its mounts and what its container
// wrote there; Stop unmounts them before it removes the directory.
func TestShareDirsBounded(t *testing.T) {
	testenv.RequireMPS(t)
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "mps")
	m, err := mps.New(dir, mps.WithRegistry(t.TempDir()), mps.WithPipeSize(256<<10))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	lim := mps.Limits{MemoryBytes: gib}
	d, err := m.Start(ctx, "bounded", gpu(0), lim)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Stop(ctx, "bounded")
	if ds, err := mps.Daemons(ctx, dir); err != nil || len(ds) != 1 || ds[0].Pid != d.Pid || !ds[0].Alive {
		t.Fatalf("Daemons = %+v, %v", ds, err)
	}
	before := freeBytes(t, dir)
	for _, c := range []struct {
		dir  string
		size int64
	}{{d.ShmDir, mps.DefaultShmBytes}, {d.PipeDir, 256 << 10}} {
		n, err := fill(c.dir, 3<<30)
		if !errors.Is(err, syscall.ENOSPC) {
			t.Errorf("%s: wrote %d bytes, then %v; want ENOSPC at %d", c.dir, n, err, c.size)
		} else if n > c.size {
			t.Errorf("%s: wrote %d bytes before ENOSPC, more than its size %d", c.dir, n, c.size)
		}
		var st unix.Statfs_t
		if err := unix.Statfs(c.dir, &st); err != nil || st.Type != unix.TMPFS_MAGIC {
			t.Errorf("%s is not a tmpfs: %#x, %v", c.dir, st.Type, err)
		}
	}
	// The disk may change meanwhile for other reasons; 3 GiB it may not.
	if after := freeBytes(t, dir); before-after > 32<<20 {
		t.Errorf("the state directory's disk lost %d bytes to the share", before-after)
	}
	// Killed and started again in place: the same mounts, content kept.
	os.Remove(filepath.Join(d.ShmDir, "fill"))
	if err := os.WriteFile(filepath.Join(d.ShmDir, "kept"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(d.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		if ds, _ := m.List(ctx); len(ds) == 1 && !ds[0].Alive {
			break
		}
		if i > 500 {
			t.Fatal("the killed daemon still runs")
		}
		time.Sleep(10 * time.Millisecond)
	}
	again, err := m.Start(ctx, "bounded", gpu(0), lim)
	if err != nil || again.Pid == d.Pid {
		t.Fatalf("Start again = %+v, %v", again, err)
	}
	if _, err := os.Stat(filepath.Join(d.ShmDir, "kept")); err != nil {
		t.Errorf("the restarted daemon's /dev/shm is not its container's: %v", err)
	}
	if got := mountedUnder(t, again.Dir); len(got) != 2 {
		t.Errorf("mounts under %s after the restart: %v, want its pipe and shm directories once each", again.Dir, got)
	}
	if err := m.Stop(ctx, "bounded"); err != nil {
		t.Fatal(err)
	}
	if got := mountedUnder(t, dir); len(got) != 0 {
		t.Errorf("left mounted after Stop: %v", got)
	}
	if _, err := os.Stat(d.Dir); !os.IsNotExist(err) {
		t.Errorf("directory after Stop: %v", err)
	}
}

// TestSweepUnmountsLeftovers: a share directory a crashed process left
// mounted, with no record, is unmounted and removed by Sweep; a link
// planted in it is removed, never followed.
func TestSweepUnmountsLeftovers(t *testing.T) {
	testenv.RequireMPS(t)
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "mps")
	m, err := mps.New(dir, mps.WithRegistry(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	d, err := m.Start(ctx, "crashed", gpu(0), mps.Limits{MemoryBytes: gib})
	if err != nil {
		t.Fatal(err)
	}
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(filepath.Join(victim+"-file"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(victim, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(victim, "keep"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, filepath.Join(d.ShmDir, "link")); err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(d.Dir, "daemon.json")) // the record lost
	stopped, err := m.Sweep(ctx, nil)
	if err != nil || len(stopped) != 1 || stopped[0] != "crashed" {
		t.Fatalf("Sweep = %v, %v", stopped, err)
	}
	if got := mountedUnder(t, dir); len(got) != 0 {
		t.Errorf("left mounted after Sweep: %v", got)
	}
	if _, err := os.Stat(filepath.Join(victim, "keep")); err != nil {
		t.Errorf("Sweep followed a planted link: %v", err)
	}
	// The daemon itself ran on without its record; it is found and ended.
	if err := syscall.Kill(d.Pid, 0); err == nil {
		if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", d.Pid)); !strings.Contains(string(b), ") Z") {
			t.Errorf("daemon %d still runs after Sweep", d.Pid)
		}
	}
}

// TestPrivateLock: the manager's directory is its user's alone (0700) and
// its lock file 0600; a directory others may write or a lock file others
// may open is refused with ErrInvalid, unchanged; a lock held elsewhere is
// waited for at most the lock timeout (ErrLocked).
func TestPrivateLock(t *testing.T) {
	testenv.RequireRoot(t)
	reg := mps.WithRegistry(t.TempDir())
	ctl := mps.WithControl("/bin/true")
	open := filepath.Join(t.TempDir(), "open")
	if err := os.Mkdir(open, 0o755); err != nil {
		t.Fatal(err)
	}
	m, err := mps.New(open, reg, ctl, mps.WithLockTimeout(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for path, want := range map[string]os.FileMode{open: 0o700 | os.ModeDir, filepath.Join(open, ".lock"): 0o600} {
		if fi, err := os.Lstat(path); err != nil || fi.Mode() != want {
			t.Errorf("%s: %v, %v; want %v", path, fi.Mode(), err, want)
		}
	}

	// Another holder of the lock: Stop waits for it, then gives up.
	f, err := os.Open(filepath.Join(open, ".lock"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	err = m.Stop(context.Background(), "someone")
	if !errors.Is(err, mps.ErrLocked) || !errors.Is(err, node.ErrUnavailable) {
		t.Errorf("Stop under another's lock: %v, want ErrLocked", err)
	}
	unix.Flock(int(f.Fd()), unix.LOCK_UN)
	if err := m.Stop(context.Background(), "someone"); err != nil {
		t.Errorf("Stop once the lock is free: %v", err)
	}

	writable := filepath.Join(t.TempDir(), "writable")
	if err := os.Mkdir(writable, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(writable, 0o777)
	if _, err := mps.New(writable, reg, ctl); !errors.Is(err, mps.ErrInvalid) {
		t.Errorf("a directory others may write: %v, want ErrInvalid", err)
	}
	if fi, _ := os.Stat(writable); fi.Mode().Perm() != 0o777 {
		t.Errorf("the refused directory was changed: %v", fi.Mode())
	}
	lax := filepath.Join(t.TempDir(), "lax")
	os.Mkdir(lax, 0o700)
	if err := os.WriteFile(filepath.Join(lax, ".lock"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	os.Chmod(filepath.Join(lax, ".lock"), 0o644)
	if _, err := mps.New(lax, reg, ctl); !errors.Is(err, mps.ErrInvalid) {
		t.Errorf("a lock file others may open: %v, want ErrInvalid", err)
	}
	linked := filepath.Join(t.TempDir(), "linked")
	os.Mkdir(linked, 0o700)
	if err := os.Symlink(filepath.Join(lax, ".lock"), filepath.Join(linked, ".lock")); err != nil {
		t.Fatal(err)
	}
	if _, err := mps.New(linked, reg, ctl); !errors.Is(err, mps.ErrInvalid) {
		t.Errorf("a link as the lock file: %v, want ErrInvalid", err)
	}
}

// TestRegistry: New records its directory in the registry, once however
// often it is made; Registered lists root's records alone, and New drops
// the records of directories that are gone.
func TestRegistry(t *testing.T) {
	testenv.RequireRoot(t)
	reg := filepath.Join(t.TempDir(), "registry")
	ctl := mps.WithControl("/bin/true")
	a, b := filepath.Join(t.TempDir(), "a"), filepath.Join(t.TempDir(), "b")
	for _, d := range []string{a, b, a} {
		m, err := mps.New(d, mps.WithRegistry(reg), ctl)
		if err != nil {
			t.Fatal(err)
		}
		m.Close()
	}
	got, err := mps.Registered(reg)
	if err != nil || strings.Join(got, " ") != strings.Join(sorted(a, b), " ") {
		t.Fatalf("Registered = %v, %v; want %s and %s", got, err, a, b)
	}
	if fi, err := os.Lstat(reg); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("registry %v, %v; want 0700", fi.Mode(), err)
	}
	// A stranger's entry, and one others may write, do not count.
	for name, set := range map[string]func(string) error{
		"stranger.dir": func(p string) error { return os.Chown(p, 65534, 65534) },
		"lax.dir":      func(p string) error { return os.Chmod(p, 0o666) },
	} {
		p := filepath.Join(reg, name)
		if err := os.WriteFile(p, []byte("/usr\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := set(p); err != nil {
			t.Fatal(err)
		}
	}
	got, err = mps.Registered(reg)
	if err == nil || !errors.Is(err, node.ErrInvalid) || strings.Join(got, " ") != strings.Join(sorted(a, b), " ") {
		t.Fatalf("Registered with untrusted entries = %v, %v", got, err)
	}
	os.Remove(filepath.Join(reg, "stranger.dir"))
	os.Remove(filepath.Join(reg, "lax.dir"))
	// b is gone: the next New drops it.
	if err := os.RemoveAll(b); err != nil {
		t.Fatal(err)
	}
	m, err := mps.New(a, mps.WithRegistry(reg), ctl)
	if err != nil {
		t.Fatal(err)
	}
	m.Close()
	if got, err := mps.Registered(reg); err != nil || len(got) != 1 || got[0] != a {
		t.Fatalf("Registered after %s went = %v, %v", b, got, err)
	}
	if got, err := mps.Registered(filepath.Join(t.TempDir(), "none")); err != nil || got != nil {
		t.Fatalf("Registered of no registry = %v, %v", got, err)
	}
}

func sorted(a, b string) []string {
	if a > b {
		return []string{b, a}
	}
	return []string{a, b}
}
