package chain

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/isolator/mps"
)

// TestShares: a memory share prepared by the chain gets its own MPS daemon
// and the daemon's directories in its launch; Recover after a lost
// allocator state holds the share again, restarts a killed daemon in
// place and stops a daemon no container explains; Cleanup stops the
// daemon and frees the share.
func TestShares(t *testing.T) {
	testenv.RequireSimulatedMPS(t)
	ctx := context.Background()
	f := newFixture(t)
	m, err := mps.New(filepath.Join(t.TempDir(), "mps"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		m.Sweep(ctx, nil)
		m.Close()
	}()
	open := func() (*Isolator, *allocator.Allocator) {
		a, err := allocator.New(f.inv, allocator.WithShared("0", "1"))
		if err != nil {
			t.Fatal(err)
		}
		return newIsolator(Config{Allocator: a, Inventory: f.inv, StateDir: f.dir, MPS: m}, f.dir, parent, f.dev), a
	}
	iso, _ := open()
	l, err := iso.Prepare(ctx, "job", allocator.Request{Share: &allocator.Share{MemoryBytes: 3 << 30}}, containerizer.Image{})
	if err != nil {
		t.Fatal(err)
	}
	if err := iso.Isolate(ctx, "job", 100); err != nil {
		t.Fatal(err)
	}
	ds, _ := m.List(ctx)
	if len(ds) != 1 || ds[0].Owner != "job" || !ds[0].Alive || l.Plan.MPS == nil || l.Plan.MPS.PipeDir != ds[0].PipeDir {
		t.Fatalf("daemons %+v, plan %+v", ds, l.Plan)
	}
	if !strings.Contains(strings.Join(l.Plan.Env, " "), "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps") {
		t.Fatalf("env %v", l.Plan.Env)
	}
	first := ds[0]
	if err := syscall.Kill(first.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for linux.Alive("", linux.Process{Pid: first.Pid, Start: first.Start}) {
		time.Sleep(time.Millisecond)
	}
	if _, err := m.Start(ctx, "stray", f.inv.Devices[1].Ref(), mps.Limits{MemoryBytes: 1 << 30}); err != nil {
		t.Fatal(err)
	}

	// A restarted agent, its allocator's state lost.
	iso2, a2 := open()
	res, err := iso2.Recover(ctx, []string{"job"})
	if err != nil || len(res.Recovered) != 1 {
		t.Fatalf("Recover = %+v, %v", res, err)
	}
	al, err := a2.Allocation("job")
	if err != nil || al.Share == nil || al.Share.MemoryBytes != 3<<30 {
		t.Fatalf("allocation after Recover: %+v, %v", al, err)
	}
	ds, _ = m.List(ctx)
	if len(ds) != 1 || ds[0].Owner != "job" || !ds[0].Alive || ds[0].Pid == first.Pid {
		log, _ := os.ReadFile(filepath.Join(ds[0].LogDir, "control.log"))
		t.Fatalf("daemons after Recover (first %d): %+v\n%s", first.Pid, ds, log)
	}
	if fi, err := os.Stat(ds[0].PipeDir); err != nil || !os.SameFile(fi, mustStatChain(t, first.PipeDir)) {
		t.Fatalf("pipe directory replaced: %v", err)
	}
	f.dev.procs = map[string][]int{} // the container's processes ended
	if err := iso2.Cleanup(ctx, "job"); err != nil {
		t.Fatal(err)
	}
	if ds, _ := m.List(ctx); len(ds) != 0 {
		t.Fatalf("daemons after Cleanup: %+v", ds)
	}
	if _, err := a2.Allocation("job"); err == nil {
		t.Fatal("the share is held after Cleanup")
	}
}

func mustStatChain(t *testing.T, p string) os.FileInfo {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi
}
