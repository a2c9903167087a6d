package containerizer_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/node"
)

// stateWrites counts the allocator state files renamed into dir while run
// runs: one per change the allocator puts on disk.
func stateWrites(t *testing.T, dir string, run func()) int {
	t.Helper()
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		t.Skipf("inotify: %v", err)
	}
	defer unix.Close(fd)
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_MOVED_FROM|unix.IN_MOVED_TO); err != nil {
		t.Fatal(err)
	}
	run()
	n := 0
	buf := make([]byte, 64<<10)
	for {
		k, err := unix.Read(fd, buf)
		if k <= 0 || err != nil {
			return n
		}
		for off := 0; off+unix.SizeofInotifyEvent <= k; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			name := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
			// The renames' other halves keep the kernel from merging two
			// of them into one event.
			if ev.Mask&unix.IN_MOVED_TO != 0 && filepath.Ext(trimNUL(name)) == ".json" {
				n++
			}
			off += unix.SizeofInotifyEvent + int(ev.Len)
		}
	}
}

func trimNUL(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// TestRecoverPersistsOnce: adopting a dead supervisor's container whose
// GPUs the allocator lost claims them with this Lifecycle's supervisor as
// their holder in one change on disk (the claim names the holder; it was a
// claim, then a change of holder).
func TestRecoverPersistsOnce(t *testing.T) {
	ctx := context.Background()
	self, err := allocator.ProcessHolder("", os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	dead := allocator.Holder{Pid: self.Pid, Start: self.Start + 1}
	inv, _ := simAllocator(t, "dgx1-volta")
	dir := t.TempDir()
	alloc := newAllocator(t, inv, allocator.WithStateDir(dir))
	rt := newReservingRuntime(alloc, nil)
	gpus := []node.DeviceRef{inv.Devices[0].Ref(), inv.Devices[1].Ref()}
	rt.ctrs["c1"] = &fakeCtr{rec: containerizer.Record{ID: "run", RuntimeID: "c1", GPUs: gpus, Supervisor: &dead}, started: true}
	l := newLifecycle(t, rt, alloc, func(c *containerizer.LifecycleConfig) { c.Supervisor = &self })
	n := stateWrites(t, dir, func() {
		if cs, err := l.Recover(ctx); err != nil || len(cs) != 1 {
			t.Fatalf("recover: %+v, %v", cs, err)
		}
	})
	if al, err := alloc.Allocation("run"); err != nil || al.Holder == nil || *al.Holder != self {
		t.Fatalf("run's GPUs: %+v, %v; want held by this process", al, err)
	}
	if n != 1 {
		t.Fatalf("the recovery of one container wrote the allocator's state %d times, want 1", n)
	}
}
