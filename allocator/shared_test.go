package allocator_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuiso/gpuiso/allocator"
)

// sharedWorkerEnv makes the test binary a worker on the state directory it
// names: it allocates and releases GPUs sharedWorkerOps times (environment
// GPUISO_ALLOCATOR_WORKER_OPS), claiming each GPU it gets with a marker
// file created exclusively, so that a GPU granted twice shows as a
// collision.
const sharedWorkerEnv = "GPUISO_ALLOCATOR_SHARED_WORKER"

func sharedWorker(dir string) int {
	ops, _ := strconv.Atoi(os.Getenv("GPUISO_ALLOCATOR_WORKER_OPS"))
	check := os.Getenv("GPUISO_ALLOCATOR_WORKER_CHECK") != ""
	inv, err := simInventory("dgx1-volta")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	ctx := context.Background()
	a, err := allocator.New(inv, allocator.WithStateDir(dir))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	defer a.Close()
	owner := "w" + strconv.Itoa(os.Getpid())
	for i := 0; i < ops; {
		al, err := a.Allocate(ctx, owner, allocator.Request{Count: 2})
		if errors.Is(err, allocator.ErrInsufficient) {
			continue // another worker holds the node: try again
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 3
		}
		var claims []string
		if check {
			for _, d := range al.Devices {
				m := filepath.Join(dir, "claims", strconv.Itoa(d.Index))
				f, err := os.OpenFile(m, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
				if err != nil {
					fmt.Fprintf(os.Stderr, "gpu %d granted twice: %v\n", d.Index, err)
					return 4
				}
				f.Close()
				claims = append(claims, m)
			}
		}
		for _, m := range claims {
			os.Remove(m)
		}
		if err := a.Release(ctx, owner); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 3
		}
		i++
	}
	return 0
}

// runWorkers runs procs workers of ops pairs each on dir and waits for all.
func runWorkers(tb testing.TB, dir string, procs, ops int, check bool) {
	tb.Helper()
	exe, err := os.Executable()
	if err != nil {
		tb.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, procs)
	for w := range procs {
		cmd := exec.Command(exe, "-test.run=^$")
		cmd.Env = append(os.Environ(), sharedWorkerEnv+"="+dir, "GPUISO_ALLOCATOR_WORKER_OPS="+strconv.Itoa(ops))
		if check {
			cmd.Env = append(cmd.Env, "GPUISO_ALLOCATOR_WORKER_CHECK=1")
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if out, err := cmd.CombinedOutput(); err != nil {
				errs[w] = fmt.Errorf("worker %d: %v: %s", w, err, out)
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		tb.Fatal(err)
	}
}

// TestSharedStateTwoAllocators: two allocators on one directory see each
// other's changes and never grant a GPU twice.
func TestSharedStateTwoAllocators(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	a := newAlloc(t, "dgx1-volta", allocator.WithStateDir(dir))
	b := newAlloc(t, "dgx1-volta", allocator.WithStateDir(dir))
	defer a.Close()
	defer b.Close()
	allocOK(t, a, "a", allocator.Request{Count: 6})
	if _, err := b.Allocate(ctx, "b", allocator.Request{Count: 4}); !errors.Is(err, allocator.ErrInsufficient) {
		t.Fatalf("b took 4 of the 2 GPUs a left: %v", err)
	}
	bl := allocOK(t, b, "b", allocator.Request{Count: 2})
	al, err := a.Allocation("a")
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range allocIndexes(al) {
		for _, y := range allocIndexes(bl) {
			if x == y {
				t.Fatalf("gpu %d granted to a and b", x)
			}
		}
	}
	if got := len(a.Allocations()); got != 2 {
		t.Fatalf("a sees %d allocations, want 2 (its own and b's)", got)
	}
	if _, err := a.Allocate(ctx, "b", allocator.Request{Count: 1}); !errors.Is(err, allocator.ErrOwnerExists) {
		t.Fatalf("a allocated for b, whom b's allocator holds: %v", err)
	}
	if err := a.Release(ctx, "b"); err != nil {
		t.Fatalf("a cannot release b's allocation made through another allocator: %v", err)
	}
	if got := len(b.Allocations()); got != 1 {
		t.Fatalf("b sees %d allocations after a released b, want 1", got)
	}
}

// TestSharedStateProcesses: workers in several processes allocate and
// release on one directory; no GPU is ever granted twice, no worker fails
// because of another's files, and the state is empty at the end.
func TestSharedStateProcesses(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "claims"), 0o700); err != nil {
		t.Fatal(err)
	}
	runWorkers(t, dir, 6, 40, true)
	a := newAlloc(t, "dgx1-volta", allocator.WithStateDir(dir))
	defer a.Close()
	if got := a.Allocations(); len(got) != 0 {
		t.Fatalf("owners left: %+v", got)
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		switch e.Name() {
		case allocator.StateFile, allocator.LockFile, "claims":
		default:
			t.Errorf("left in the state directory: %s", e.Name())
		}
	}
}

// TestStaleTempFiles: New removes the temporary files of writers that died
// and leaves those of live processes alone.
func TestStaleTempFiles(t *testing.T) {
	dir := t.TempDir()
	dead := deadPid(t)
	gone := filepath.Join(dir, "."+allocator.StateFile+"."+strconv.Itoa(dead)+".123.tmp")
	live := filepath.Join(dir, "."+allocator.StateFile+"."+strconv.Itoa(os.Getppid())+".456.tmp")
	for _, f := range []string{gone, live} {
		if err := os.WriteFile(f, []byte("{"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	a := newAlloc(t, "dgx1-volta", allocator.WithStateDir(dir))
	defer a.Close()
	if _, err := os.Stat(gone); err == nil {
		t.Error("the temporary file of a dead writer stayed")
	}
	if _, err := os.Stat(live); err != nil {
		t.Errorf("the temporary file of a live process was removed: %v", err)
	}
}

// deadPid returns the pid of a process that has ended and been reaped.
func deadPid(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("/bin/true")
	if err := cmd.Run(); err != nil {
		t.Skipf("no /bin/true: %v", err)
	}
	return cmd.Process.Pid
}

// TestReleaseDead: owners whose holder died are released; live holders and
// owners without one are kept.
func TestReleaseDead(t *testing.T) {
	if _, err := allocator.ProcessHolder("", os.Getpid()); err != nil {
		t.Skipf("no proc file system: %v", err)
	}
	ctx := context.Background()
	dir := t.TempDir()
	a := newAlloc(t, "dgx1-volta", allocator.WithStateDir(dir))
	defer a.Close()
	self, err := allocator.ProcessHolder("", os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/bin/sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Skip(err)
	}
	child, err := allocator.ProcessHolder("", cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	reused := allocator.Holder{Pid: self.Pid, Start: self.Start + 1} // same pid, another process
	allocOK(t, a, "live", allocator.Request{Count: 1, Holder: &self})
	allocOK(t, a, "child", allocator.Request{Count: 1, Holder: &child})
	allocOK(t, a, "reused", allocator.Request{Count: 1, Holder: &reused})
	allocOK(t, a, "nobody", allocator.Request{Count: 1})
	if got, err := a.ReleaseDead(ctx); err != nil || len(got) != 1 || got[0] != "reused" {
		t.Fatalf("ReleaseDead = %v, %v; want [reused]", got, err)
	}
	cmd.Process.Kill()
	cmd.Wait()
	// Another allocator on the directory sees the holders too.
	b := newAlloc(t, "dgx1-volta", allocator.WithStateDir(dir))
	defer b.Close()
	if got, err := b.ReleaseDead(ctx); err != nil || len(got) != 1 || got[0] != "child" {
		t.Fatalf("ReleaseDead = %v, %v; want [child]", got, err)
	}
	var owners []string
	for _, al := range a.Allocations() {
		owners = append(owners, al.Owner)
	}
	if fmt.Sprint(owners) != "[live nobody]" {
		t.Fatalf("owners %v, want [live nobody]", owners)
	}
	if al, _ := a.Allocation("live"); al.Holder == nil || *al.Holder != self {
		t.Fatalf("holder of live = %v, want %v", al.Holder, self)
	}
	if _, err := a.Allocate(ctx, "bad", allocator.Request{Count: 1, Holder: &allocator.Holder{}}); !errors.Is(err, allocator.ErrInvalidRequest) {
		t.Fatalf("a zero holder: %v", err)
	}
}

// BenchmarkSharedStateDir measures Allocate+Release pairs per second on one
// state directory from 1 and from 4 processes (re-executions of the test
// binary); b.N pairs in all.
func BenchmarkSharedStateDir(b *testing.B) {
	for _, procs := range []int{1, 4} {
		b.Run(fmt.Sprintf("procs=%d", procs), func(b *testing.B) {
			dir := b.TempDir()
			ops := max(b.N/procs, 1)
			start := time.Now()
			runWorkers(b, dir, procs, ops, false)
			el := time.Since(start)
			b.ReportMetric(float64(ops*procs)/el.Seconds(), "pairs/s")
		})
	}
}

// TestSharedDeviceNamedTwice: WithShared refuses a GPU named twice, by
// the same or another reference.
func TestSharedDeviceNamedTwice(t *testing.T) {
	inv := simInv(t, "dgx1-volta")
	for _, refs := range [][]string{{"0", "0"}, {"1", inv.Devices[1].UUID}} {
		if _, err := allocator.New(inv, allocator.WithShared(refs...)); !errors.Is(err, allocator.ErrDuplicateDevice) {
			t.Errorf("WithShared(%q): %v, want ErrDuplicateDevice", refs, err)
		}
	}
}

// TestExclusive: while one allocator runs a function under Exclusive, an
// allocator of the same directory waits for it, and then sees what the
// function did; the function itself may change the state.
func TestExclusive(t *testing.T) {
	dir := t.TempDir()
	inv := simInv(t, "dgx1-volta")
	a1, err := allocator.New(inv, allocator.WithStateDir(dir))
	if err != nil {
		t.Fatal(err)
	}
	defer a1.Close()
	a2, err := allocator.New(inv.Clone(), allocator.WithStateDir(dir))
	if err != nil {
		t.Fatal(err)
	}
	defer a2.Close()
	ctx := context.Background()
	done := make(chan allocator.Allocation, 1)
	err = a1.Exclusive(ctx, func() error {
		go func() {
			al, err := a2.Allocate(ctx, "second", allocator.Request{Count: 8})
			if err != nil {
				al = allocator.Allocation{Owner: err.Error()}
			}
			done <- al
		}()
		time.Sleep(200 * time.Millisecond)
		select {
		case al := <-done:
			return fmt.Errorf("the other allocator changed the state during Exclusive: %+v", al)
		default:
		}
		_, err := a1.Allocate(ctx, "first", allocator.Request{Devices: []string{"0"}})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if al := <-done; !strings.Contains(al.Owner, "not enough free GPUs") { // 8 asked, 7 free after "first"
		t.Fatalf("after Exclusive: %+v", al)
	}
	if _, err := a2.Allocation("first"); err != nil {
		t.Fatalf("the other allocator does not see the change made under Exclusive: %v", err)
	}
	var zero allocator.Allocator
	if err := zero.Exclusive(ctx, func() error { return nil }); !errors.Is(err, allocator.ErrNotMade) {
		t.Fatalf("zero allocator: %v", err)
	}
}
