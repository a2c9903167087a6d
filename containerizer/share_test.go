package containerizer_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/isolator/mps"
	"github.com/gpuiso/gpuiso/node"
)

// planRuntime is a fakeRuntime that keeps the plan each container got, and
// keeps the records' shares as a runtime's labels or records do.
type planRuntime struct {
	*fakeRuntime
	mu    sync.Mutex
	plans map[string]*isolator.Plan
}

func (p *planRuntime) Create(ctx context.Context, spec containerizer.Spec, pr *containerizer.Prepared) (containerizer.Record, error) {
	rec, err := p.fakeRuntime.Create(ctx, spec, pr)
	if err == nil {
		p.mu.Lock()
		p.plans[spec.ID] = pr.Plan
		p.mu.Unlock()
	}
	return rec, err
}

func (p *planRuntime) plan(id string) *isolator.Plan {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.plans[id]
}

func shareLifecycle(t *testing.T, rt containerizer.Runtime, alloc *allocator.Allocator, m *mps.Manager) *containerizer.Lifecycle {
	t.Helper()
	l, err := containerizer.NewLifecycle(containerizer.LifecycleConfig{Runtime: rt, Allocator: alloc, MPS: m})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func shareManager(t *testing.T) *mps.Manager {
	t.Helper()
	testenv.RequireSimulatedMPS(t)
	m, err := mps.New(filepath.Join(t.TempDir(), "mps"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ds, _ := m.List(context.Background())
		for _, d := range ds {
			m.Stop(context.Background(), d.Owner)
		}
		m.Close()
	})
	return m
}

func running(t *testing.T, m *mps.Manager) map[string]mps.Daemon {
	t.Helper()
	ds, err := m.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]mps.Daemon{}
	for _, d := range ds {
		if d.Alive {
			out[d.Owner] = d
		}
	}
	return out
}

// TestLaunchShares: a memory share's container gets its own MPS daemon,
// its pipe directory, its /dev/shm and its limits in its plan, and loses
// the daemon with the container; a time slice gets no daemon and no MPS;
// without a daemon manager a memory share is refused and nothing is held.
func TestLaunchShares(t *testing.T) {
	ctx := context.Background()
	m := shareManager(t)
	inv, _ := simAllocator(t, "dgx1-volta")
	alloc, err := allocator.New(inv, allocator.WithShared("0", "1", "2", "3", "4", "5", "6", "7"))
	if err != nil {
		t.Fatal(err)
	}
	rt := &planRuntime{fakeRuntime: newFakeRuntime(), plans: map[string]*isolator.Plan{}}
	l := shareLifecycle(t, rt, alloc, m)
	mem := containerizer.Spec{ID: "mem", Command: []string{"x"}, GPUs: allocator.Request{Share: &allocator.Share{MemoryBytes: 4 << 30, ComputePercent: 40}}}
	c, err := l.Launch(ctx, mem)
	if err != nil {
		t.Fatal(err)
	}
	if c.Share == nil || c.Share.MemoryBytes != 4<<30 || len(c.GPUs) != 1 {
		t.Fatalf("container = %+v", c)
	}
	d, ok := running(t, m)["mem"]
	if !ok || d.GPU != c.GPUs[0].UUID || d.Limits != (mps.Limits{MemoryBytes: 4 << 30, ComputePercent: 40}) {
		t.Fatalf("daemon = %+v (%v)", d, ok)
	}
	plan := rt.plan("mem")
	env := strings.Join(plan.Env, " ")
	for _, want := range []string{"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=40", "CUDA_VISIBLE_DEVICES=" + d.GPU} {
		if !strings.Contains(env, want) {
			t.Errorf("plan env lacks %s: %s", want, env)
		}
	}
	if plan.MPS == nil || plan.MPS.PipeDir != d.PipeDir || plan.MPS.ShmDir != d.ShmDir || len(plan.Mounts) != 2 {
		t.Fatalf("plan = %+v", plan)
	}
	if rec := rt.get("rt-1").rec; rec.Share == nil || rec.Share.ComputePercent != 40 {
		t.Fatalf("record = %+v", rec)
	}

	ts := containerizer.Spec{ID: "slice", Command: []string{"x"}, GPUs: allocator.Request{Share: &allocator.Share{Mode: allocator.ShareTime}}}
	if _, err := l.Launch(ctx, ts); err != nil {
		t.Fatal(err)
	}
	if _, ok := running(t, m)["slice"]; ok {
		t.Fatal("a time slice got an MPS daemon")
	}
	if p := rt.plan("slice"); p.MPS != nil || strings.Contains(strings.Join(p.Env, " "), "CUDA_MPS") {
		t.Fatalf("time slice plan = %+v", p)
	}

	if err := l.Destroy(ctx, "mem"); err != nil {
		t.Fatal(err)
	}
	if linux.Alive("", linux.Process{Pid: d.Pid, Start: d.Start}) || len(running(t, m)) != 0 {
		t.Fatalf("daemon after Destroy: %+v", running(t, m))
	}
	if _, err := alloc.Allocation("mem"); !errors.Is(err, allocator.ErrUnknownOwner) {
		t.Fatalf("allocation after Destroy: %v", err)
	}

	// No manager: refused before anything runs, nothing held.
	bare := shareLifecycle(t, newFakeRuntime(), alloc, nil)
	if _, err := bare.Launch(ctx, containerizer.Spec{ID: "nomps", Command: []string{"x"}, GPUs: allocator.Request{Share: &allocator.Share{MemoryBytes: 1 << 30}}}); !errors.Is(err, containerizer.ErrNoMPS) || !errors.Is(err, mps.ErrNoManager) || !errors.Is(err, node.ErrNotSupported) {
		t.Fatalf("memory share without MPS: %v", err)
	}
	if _, err := alloc.Allocation("nomps"); !errors.Is(err, allocator.ErrUnknownOwner) {
		t.Fatalf("allocation after a refused share: %v", err)
	}
}

// TestRecoverShares: a Lifecycle that lost its allocator's state claims a
// running container's share again as a share, keeps its running daemon,
// starts a killed one again where its container's mounts still find it,
// and stops the daemons no container explains.
func TestRecoverShares(t *testing.T) {
	ctx := context.Background()
	m := shareManager(t)
	inv, _ := simAllocator(t, "dgx1-volta")
	shared := allocator.WithShared("0", "1", "2", "3", "4", "5", "6", "7")
	alloc, err := allocator.New(inv, shared)
	if err != nil {
		t.Fatal(err)
	}
	rt := &planRuntime{fakeRuntime: newFakeRuntime(), plans: map[string]*isolator.Plan{}}
	l := shareLifecycle(t, rt, alloc, m)
	for _, id := range []string{"a", "b"} {
		if _, err := l.Launch(ctx, containerizer.Spec{ID: id, Command: []string{"x"}, GPUs: allocator.Request{MemoryBytes: 6 << 30}}); err != nil {
			t.Fatal(err)
		}
	}
	before := running(t, m)
	// The daemon of a share whose starter died before its container was
	// made: no container explains it.
	if _, err := m.Start(ctx, "orphan", inv.Devices[5].Ref(), mps.Limits{MemoryBytes: 1 << 30}); err != nil {
		t.Fatal(err)
	}
	// b's daemon is killed.
	if err := syscall.Kill(before["b"].Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for linux.Alive("", linux.Process{Pid: before["b"].Pid, Start: before["b"].Start}) {
		time.Sleep(time.Millisecond)
	}
	pipeB, err := os.Stat(before["b"].PipeDir)
	if err != nil {
		t.Fatal(err)
	}

	// A restarted process: a fresh allocator, the same runtime and daemons.
	fresh, err := allocator.New(inv, shared)
	if err != nil {
		t.Fatal(err)
	}
	l2 := shareLifecycle(t, rt, fresh, m)
	if _, err := l2.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	after := running(t, m)
	if len(after) != 2 || after["a"].Pid != before["a"].Pid || after["b"].Pid == before["b"].Pid {
		t.Fatalf("daemons before %+v, after %+v", before, after)
	}
	// b's new daemon serves the pipe directory b's container has mounted.
	if now, err := os.Stat(filepath.Join(after["b"].PipeDir, "control")); err != nil || !os.SameFile(pipeB, mustStat(t, after["b"].PipeDir)) || now == nil {
		t.Fatalf("b's pipe directory after the restart: %v", err)
	}
	for _, id := range []string{"a", "b"} {
		al, err := fresh.Allocation(id)
		if err != nil || al.Share == nil || al.Share.Mode != allocator.ShareMemory || al.Share.MemoryBytes != 6<<30 {
			t.Fatalf("allocation of %s after recovery: %+v, %v", id, al, err)
		}
	}
	// Both on one 16 GiB GPU, as packed at launch: a third share of 6
	// GiB lands elsewhere.
	a, _ := fresh.Allocation("a")
	b, _ := fresh.Allocation("b")
	c, err := fresh.Allocate(ctx, "c", allocator.Request{MemoryBytes: 6 << 30})
	if err != nil || a.Devices[0].UUID != b.Devices[0].UUID || c.Devices[0].UUID == a.Devices[0].UUID {
		t.Fatalf("a on %s, b on %s, c on %v (%v)", a.Devices[0].UUID, b.Devices[0].UUID, c.Devices, err)
	}
}

func mustStat(t *testing.T, p string) os.FileInfo {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi
}
