package linux_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
)

// startSleep starts `sleep 300` with env added to the test's environment
// and returns its process; it is killed at the test's end whatever
// happens.
func startSleep(t *testing.T, env ...string) linux.Process {
	t.Helper()
	cmd := exec.Command("sleep", "300")
	cmd.Env = append(os.Environ(), env...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-done })
	p, err := linux.ProcessOf("/proc", cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func newMark(t *testing.T) linux.Mark {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return linux.Mark{Comm: "sleep", Env: "GPUISO_TEST_MARK=" + hex.EncodeToString(b[:])}
}

// TestMarked finds the live processes that carry a mark, and no other.
func TestMarked(t *testing.T) {
	mark := newMark(t)
	a := startSleep(t, mark.Env)
	b := startSleep(t, mark.Env)
	startSleep(t, mark.Env+"x")                    // a longer value
	startSleep(t, "OTHER="+mark.Env)               // not the variable
	startSleep(t)                                  // unmarked
	other := linux.Mark{Comm: "sh", Env: mark.Env} // another command
	got := linux.Marked("/proc", mark)
	slices.SortFunc(got, func(x, y linux.Process) int { return x.Pid - y.Pid })
	want := []linux.Process{a, b}
	slices.SortFunc(want, func(x, y linux.Process) int { return x.Pid - y.Pid })
	if !slices.Equal(got, want) {
		t.Fatalf("Marked = %+v, want %+v", got, want)
	}
	if got := linux.Marked("/proc", other); len(got) != 0 {
		t.Fatalf("Marked of another command = %+v", got)
	}
	if got := linux.Marked("/proc", linux.Mark{Comm: "sleep"}); got != nil {
		t.Fatalf("Marked of no mark = %+v", got)
	}
}

// TestReclaim takes back all a daemon leaves, in order: its process and
// the marked ones, a directory emptied and kept, a tmpfs mount, its
// cgroup and its parent, its directory.
func TestReclaim(t *testing.T) {
	testenv.RequireRoot(t)
	ctx := context.Background()
	dir := t.TempDir()
	own := filepath.Join(dir, "daemon")
	shm := filepath.Join(own, "shm")
	pipe := filepath.Join(dir, "pipe")
	for _, d := range []string{shm, filepath.Join(pipe, "sub")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(pipe, "control"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := linux.MountSizedTmpfs(shm, 0o755, 1<<20, 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { linux.UnmountAll(shm) })
	hs, err := linux.CgroupHierarchies("/sys/fs/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	parent := fmt.Sprintf("/gpuiso-test-reclaim-%d", os.Getpid())
	cg := parent + "/daemon"
	t.Cleanup(func() { linux.RemoveCgroup(hs, cg); linux.RemoveCgroup(hs, parent) })
	mark := newMark(t)
	daemon := startSleep(t)
	server := startSleep(t, mark.Env)
	if err := linux.MakeCgroup(hs, cg); err != nil {
		t.Fatal(err)
	}
	if err := linux.MoveToCgroup(hs, cg, daemon.Pid, ""); err != nil {
		t.Fatal(err)
	}
	rem := linux.Remains{
		Processes: []linux.Process{daemon}, Marked: mark,
		Empty: []string{pipe}, Mounts: []string{shm},
		Hierarchies: hs, Cgroup: cg, ParentToo: true, Dir: own,
	}
	if err := linux.Reclaim(ctx, "/proc", rem, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	for _, p := range []linux.Process{daemon, server} {
		if !linux.Dead("/proc", p) {
			t.Errorf("process %d runs on", p.Pid)
		}
	}
	if entries, err := os.ReadDir(pipe); err != nil || len(entries) != 0 {
		t.Errorf("%s: %v, %v: want kept and empty", pipe, entries, err)
	}
	if _, err := os.Lstat(own); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s is still there (%v)", own, err)
	}
	for _, h := range hs {
		for _, c := range []string{cg, parent} {
			if _, err := os.Stat(filepath.Join(h.Dir, c)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("cgroup %s of %s is still there (%v)", c, h.Dir, err)
			}
		}
	}
	// Everything is gone: again is not an error.
	if err := linux.Reclaim(ctx, "/proc", rem, time.Second); err != nil {
		t.Fatalf("Reclaim again: %v", err)
	}
}

// TestReclaimKeepsWhatALiveProcessUses: a process that does not end
// within the bound is an error matching ErrStillRuns, and nothing else is
// touched: a live process may still use it. Here the proc tree is a copy
// that goes on showing a process that was killed.
func TestReclaimKeepsWhatALiveProcessUses(t *testing.T) {
	dir := t.TempDir()
	keep := filepath.Join(dir, "keep")
	if err := os.Mkdir(keep, 0o755); err != nil {
		t.Fatal(err)
	}
	p := startSleep(t)
	proc := filepath.Join(dir, "proc")
	stat := filepath.Join(proc, strconv.Itoa(p.Pid), "stat")
	if err := os.MkdirAll(filepath.Dir(stat), 0o755); err != nil {
		t.Fatal(err)
	}
	line := fmt.Sprintf("%d (sleep) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 %d 0 0", p.Pid, p.Start)
	if err := os.WriteFile(stat, []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
	err := linux.Reclaim(context.Background(), proc, linux.Remains{Processes: []linux.Process{p}, Dir: keep}, 50*time.Millisecond)
	if !errors.Is(err, linux.ErrStillRuns) {
		t.Fatalf("Reclaim = %v, want ErrStillRuns", err)
	}
	if _, err := os.Stat(keep); err != nil {
		t.Fatalf("%s removed although a process runs on: %v", keep, err)
	}
}
