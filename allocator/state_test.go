package allocator_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuiso/gpuiso/allocator"
)

const crashChildEnv = "GPUISO_ALLOCATOR_CRASH_CHILD"

func TestMain(m *testing.M) {
	if dir := os.Getenv(crashChildEnv); dir != "" {
		os.Exit(crashChild(dir))
	}
	if arg := os.Getenv(claimWorkerEnv); arg != "" {
		os.Exit(claimWorker(arg))
	}
	if dir := os.Getenv(sharedWorkerEnv); dir != "" {
		os.Exit(sharedWorker(dir))
	}
	os.Exit(m.Run())
}

func TestStateSurvivesRestart(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	inv := simInv(t, "dgx1-volta")
	a, err := allocator.New(inv, allocator.WithStateDir(dir), allocator.WithShared("7"))
	if err != nil {
		t.Fatal(err)
	}
	allocOK(t, a, "a", allocator.Request{Count: 2, Group: "g"})
	allocOK(t, a, "b", allocator.Request{Count: 4})
	allocOK(t, a, "s", allocator.Request{Share: &allocator.Share{MemoryBytes: 1 << 30}})
	if _, err := a.MarkUnhealthy(ctx, "6", "XID 79"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Resize(ctx, "b", 3); err != nil {
		t.Fatal(err)
	}
	want := a.Allocations()

	b, err := allocator.New(inv, allocator.WithStateDir(dir), allocator.WithShared("7"))
	if err != nil {
		t.Fatal(err)
	}
	if got := b.Allocations(); !equalAllocations(got, want) {
		t.Fatalf("after restart\n got %+v\nwant %+v", got, want)
	}
	if h := b.Devices()[6].Health; h.Healthy || h.Reason != "XID 79" {
		t.Fatalf("health not kept: %v", h)
	}
	if len(b.Warnings()) != 0 {
		t.Fatalf("warnings %v", b.Warnings())
	}
	if err := allocator.CheckInvariants(b); err != nil {
		t.Fatal(err)
	}
	// No temporary files are left behind: the state and its lock file.
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 || entries[0].Name() != allocator.StateFile || entries[1].Name() != allocator.LockFile {
		t.Fatalf("state dir holds %v", entries)
	}
}

func equalAllocations(x, y []allocator.Allocation) bool {
	return slices.EqualFunc(x, y, func(a, b allocator.Allocation) bool {
		return a.Owner == b.Owner && a.Group == b.Group && a.Shared == b.Shared && a.MemoryBytes == b.MemoryBytes &&
			slices.Equal(allocIndexes(a), allocIndexes(b)) && reflect.DeepEqual(a.Share, b.Share)
	})
}

func TestCorruptStateRefused(t *testing.T) {
	inv := simInv(t, "dgx1-volta")
	good := func(t *testing.T) (string, []byte) {
		dir := t.TempDir()
		a, err := allocator.New(inv, allocator.WithStateDir(dir))
		if err != nil {
			t.Fatal(err)
		}
		allocOK(t, a, "a", allocator.Request{Count: 2})
		b, err := os.ReadFile(filepath.Join(dir, allocator.StateFile))
		if err != nil {
			t.Fatal(err)
		}
		return dir, b
	}
	tests := map[string]func([]byte) []byte{
		"empty":          func([]byte) []byte { return nil },
		"truncated":      func(b []byte) []byte { return b[:len(b)/2] },
		"one byte short": func(b []byte) []byte { return b[:len(b)-3] },
		"flipped owner":  func(b []byte) []byte { return []byte(strings.Replace(string(b), `"owner":"a"`, `"owner":"b"`, 1)) },
		"bad checksum":   func(b []byte) []byte { return []byte(strings.Replace(string(b), "sha256:", "sha256:00", 1)) },
		"version 2":      func(b []byte) []byte { return []byte(strings.Replace(string(b), `"version":1`, `"version":2`, 1)) },
		"other format":   func(b []byte) []byte { return []byte(strings.Replace(string(b), "gpuiso.allocator.state", "x", 1)) },
		"garbage":        func([]byte) []byte { return []byte("\x00\x01garbage") },
		"trailing data":  func(b []byte) []byte { return append(b, []byte("{}")...) },
	}
	for name, mangle := range tests {
		t.Run(name, func(t *testing.T) {
			dir, b := good(t)
			path := filepath.Join(dir, allocator.StateFile)
			bad := mangle(b)
			if err := os.WriteFile(path, bad, 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := allocator.New(inv, allocator.WithStateDir(dir))
			var se *allocator.StateError
			if !errors.As(err, &se) || se.File != path || !errors.Is(err, allocator.ErrCorruptState) || !strings.Contains(err.Error(), path) {
				t.Fatalf("err = %v", err)
			}
			if after, _ := os.ReadFile(path); string(after) != string(bad) {
				t.Fatal("corrupt state file was replaced")
			}
		})
	}
}

func TestStateWriteFailureChangesNothing(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	a, err := allocator.New(simInv(t, "dgx1-volta"), allocator.WithStateDir(dir))
	if err != nil {
		t.Fatal(err)
	}
	allocOK(t, a, "a", allocator.Request{Count: 2})
	// A directory where the state file was makes every rename fail.
	path := filepath.Join(dir, allocator.StateFile)
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(path, "block"), 0o700); err != nil {
		t.Fatal(err)
	}
	before := a.Allocations()
	if _, err := a.Allocate(ctx, "b", allocator.Request{Count: 2}); err == nil {
		t.Fatal("allocation without its state on disk succeeded")
	}
	if err := a.Release(ctx, "a"); err == nil {
		t.Fatal("release without its state on disk succeeded")
	}
	if _, err := a.MarkUnhealthy(ctx, "0", "x"); err == nil {
		t.Fatal("health change without its state on disk succeeded")
	}
	if !equalAllocations(a.Allocations(), before) || !a.Devices()[0].Health.Healthy {
		t.Fatal("failed writes changed the allocator")
	}
	if err := allocator.CheckInvariants(a); err != nil {
		t.Fatal(err)
	}
}

func TestReconcile(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	inv := simInv(t, "dgx1-volta")
	a, err := allocator.New(inv, allocator.WithStateDir(dir))
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range []string{"alive-1", "dead-1", "alive-2", "dead-2"} {
		allocOK(t, a, o, allocator.Request{Count: 2})
	}
	kept := []allocator.Allocation{a.Allocations()[0], a.Allocations()[1]}
	// After a crash: a new allocator loads the state, the isolators report
	// who is alive.
	b, err := allocator.New(inv, allocator.WithStateDir(dir))
	if err != nil {
		t.Fatal(err)
	}
	res, err := b.Reconcile(ctx, []string{"alive-1", "alive-2", "new-1"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Released, []string{"dead-1", "dead-2"}) || !slices.Equal(res.Kept, []string{"alive-1", "alive-2"}) ||
		!slices.Equal(res.Unknown, []string{"new-1"}) {
		t.Fatalf("result %+v", res)
	}
	if !equalAllocations(b.Allocations(), kept) {
		t.Fatalf("after reconcile %+v", b.Allocations())
	}
	c, err := allocator.New(inv, allocator.WithStateDir(dir))
	if err != nil {
		t.Fatal(err)
	}
	if !equalAllocations(c.Allocations(), kept) {
		t.Fatal("reconcile not on disk")
	}
	if len(c.Free()) != 4 {
		t.Fatalf("free %v", c.Free())
	}
}

func TestStateDropsVanishedGPU(t *testing.T) {
	dir := t.TempDir()
	inv := simInv(t, "dgx1-volta")
	a, err := allocator.New(inv, allocator.WithStateDir(dir))
	if err != nil {
		t.Fatal(err)
	}
	allocOK(t, a, "a", allocator.Request{Devices: []string{"0", "3"}})
	// The node comes back with GPU 3 gone (replaced by another UUID).
	changed := inv.Clone()
	changed.Devices[3].UUID = "GPU-replaced"
	b, err := allocator.New(changed, allocator.WithStateDir(dir))
	if err != nil {
		t.Fatal(err)
	}
	if got := allocIndexes(b.Allocations()[0]); !slices.Equal(got, []int{0}) || len(b.Warnings()) != 1 {
		t.Fatalf("allocation %v, warnings %v", got, b.Warnings())
	}
}

// crashChild allocates, resizes and releases on a durable allocator until
// it is killed, writing "B <op>" before each operation and "D <result>"
// after it returns.
func crashChild(dir string) int {
	seed, _ := strconv.ParseUint(os.Getenv(crashChildEnv+"_SEED"), 10, 64)
	inv, err := simInventory("dgx1-volta")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	a, err := allocator.New(inv, allocator.WithStateDir(dir))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, 99))
	fmt.Println("ready")
	for n := 0; ; n++ {
		owners := a.Allocations()
		switch op := rng.IntN(3); {
		case op == 0 || len(owners) == 0:
			owner, count := fmt.Sprintf("o-%d-%d", seed, n), 1+rng.IntN(4)
			fmt.Printf("B alloc %s %d\n", owner, count)
			al, err := a.Allocate(ctx, owner, allocator.Request{Count: count})
			crashReport(al, err)
		case op == 1:
			owner := owners[rng.IntN(len(owners))].Owner
			fmt.Printf("B release %s 0\n", owner)
			crashReport(allocator.Allocation{}, a.Release(ctx, owner))
		default:
			owner, count := owners[rng.IntN(len(owners))].Owner, 1+rng.IntN(4)
			fmt.Printf("B resize %s %d\n", owner, count)
			al, err := a.Resize(ctx, owner, count)
			crashReport(al, err)
		}
	}
}

func crashReport(al allocator.Allocation, err error) {
	if err != nil {
		fmt.Println("D err")
		return
	}
	fmt.Printf("D ok %s\n", strings.Trim(strings.Join(strings.Fields(fmt.Sprint(allocIndexes(al))), ","), "[]"))
}

type crashOp struct {
	kind, owner string
	count       int
}

// TestCrashConsistency kills a child allocating and releasing with a state
// directory at random moments, at least 100 times. After each kill the
// state on disk must hold exactly the operations that returned, plus at
// most the one in flight (applied whole or not at all).
func TestCrashConsistency(t *testing.T) {
	if testing.Short() {
		t.Skip("crash test spawns 100 processes")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	inv := simInv(t, "dgx1-volta")
	rng := rand.New(rand.NewPCG(11, 12))
	model := map[string][]int{}
	inFlightSeen := 0
	const kills = 100
	for round := range kills {
		cmd := exec.Command(exe, "-test.run=^$")
		cmd.Env = append(os.Environ(), crashChildEnv+"="+dir, fmt.Sprintf("%s_SEED=%d", crashChildEnv, round+1))
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		lines := make(chan string, 1024)
		go func() {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				lines <- sc.Text()
			}
			close(lines)
		}()
		if l, ok := <-lines; !ok || l != "ready" {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("round %d: child said %q", round, l)
		}
		time.Sleep(time.Duration(rng.IntN(20_000)) * time.Microsecond)
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		var pending *crashOp
		for l := range lines {
			f := strings.Fields(l)
			switch {
			case len(f) == 4 && f[0] == "B":
				c, _ := strconv.Atoi(f[3])
				pending = &crashOp{f[1], f[2], c}
			case len(f) >= 2 && f[0] == "D":
				if pending == nil {
					t.Fatalf("round %d: result without operation: %q", round, l)
				}
				if f[1] == "ok" {
					applyOp(model, *pending, f[2:])
				}
				pending = nil
			default:
				t.Fatalf("round %d: child said %q", round, l)
			}
		}
		cmd.Wait()
		a, err := allocator.New(inv, allocator.WithStateDir(dir))
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		got := map[string][]int{}
		for _, al := range a.Allocations() {
			got[al.Owner] = allocIndexes(al)
		}
		if !equalModel(got, model) {
			if pending == nil || !pendingApplied(got, model, *pending) {
				t.Fatalf("round %d: state %v, returned operations give %v, in flight %+v", round, got, model, pending)
			}
			inFlightSeen++
			model = got
		}
		if err := allocator.CheckInvariants(a); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d kills, %d with the operation in flight already on disk", kills, inFlightSeen)
}

func applyOp(model map[string][]int, op crashOp, result []string) {
	switch op.kind {
	case "release":
		delete(model, op.owner)
	default:
		var set []int
		if len(result) > 0 {
			for _, s := range strings.Split(result[0], ",") {
				i, _ := strconv.Atoi(s)
				set = append(set, i)
			}
		}
		model[op.owner] = set
	}
}

func equalModel(x, y map[string][]int) bool {
	return maps.EqualFunc(x, y, func(a, b []int) bool { return slices.Equal(a, b) })
}

// pendingApplied tells whether got is model with op applied whole.
func pendingApplied(got, model map[string][]int, op crashOp) bool {
	want := maps.Clone(model)
	switch op.kind {
	case "release":
		delete(want, op.owner)
		return equalModel(got, want)
	default:
		set, ok := got[op.owner]
		if !ok || len(set) != op.count {
			return false
		}
		want[op.owner] = set
		return equalModel(got, want)
	}
}
