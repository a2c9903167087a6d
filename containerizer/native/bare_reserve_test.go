package native

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
)

// TestBareReservationLeft: a container directory a killed process left
// before its first record (a reservation) is removed by the next Recover
// or Clean, with the GPUs held for it; a live process's stays, with its.
func TestBareReservationLeft(t *testing.T) {
	deadProc := exec.Command("/bin/true")
	if err := deadProc.Run(); err != nil {
		t.Skip(err)
	}
	dead := allocator.Holder{Pid: deadProc.Process.Pid, Start: 1}
	live, err := allocator.ProcessHolder("", os.Getppid())
	if err != nil {
		t.Skip(err)
	}
	for _, tc := range []struct {
		name    string
		sup     allocator.Holder
		recover bool
		gone    bool
	}{
		{"recover, dead supervisor", dead, true, true},
		{"clean, dead supervisor", dead, false, true},
		{"recover, live supervisor", live, true, false},
		{"clean, live supervisor", live, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newBareNode(t)
			ctx := context.Background()
			dir := filepath.Join(n.state, "left")
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := writeSupervisor(dir, "left", tc.sup); err != nil {
				t.Fatal(err)
			}
			sup := tc.sup
			if _, err := n.alloc.Allocate(ctx, "left", allocator.Request{Count: 2, Holder: &sup}); err != nil {
				t.Fatal(err)
			}
			if tc.recover {
				_, err = n.c.Recover(ctx)
			} else {
				_, err = n.c.Clean(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.gone {
				n.nothingLeft(t, "left")
				return
			}
			if _, err := os.Stat(dir); err != nil {
				t.Errorf("a live process's reservation was removed: %v", err)
			}
			if _, err := n.alloc.Allocation("left"); err != nil {
				t.Errorf("a live process's reservation lost its GPUs: %v", err)
			}
		})
	}
}

// TestBareList: the runtime lists a record per container directory, with
// its supervisor, running or exited (recorded exit, or an init that is
// gone), a directory without a record as a reservation, and an unreadable
// record of a cgroup with processes with Err; other names are no
// containers.
func TestBareList(t *testing.T) {
	n := newBareNode(t)
	ctx := context.Background()
	for _, spec := range []containerizer.Spec{
		{ID: "runs", Command: []string{"sleep", "60"}, GPUs: allocator.Request{Count: 2}},
		{ID: "ended", Command: []string{"sh", "-c", "exit 3"}},
		{ID: "broken", Command: []string{"sleep", "60"}},
	} {
		if _, err := n.c.Launch(ctx, spec); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := n.c.Wait(ctx, "ended"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(n.state, "broken", "container.json"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	deadProc := exec.Command("/bin/true")
	if err := deadProc.Run(); err != nil {
		t.Skip(err)
	}
	for _, dir := range []string{"reserved", "vanished", ".tmp-1.2-x", ".new-a.1.2"} {
		if err := os.Mkdir(filepath.Join(n.state, dir), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := writeSupervisor(filepath.Join(n.state, "reserved"), "reserved", n.c.rt.self); err != nil {
		t.Fatal(err)
	}
	// A record whose init is gone without recording its exit.
	if err := n.c.rt.writeRecord(ctrRecord{ID: "vanished", Pid: deadProc.Process.Pid, Start: 1}); err != nil {
		t.Fatal(err)
	}
	recs, err := n.c.rt.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range recs {
		s := r.ID
		switch {
		case r.Err != nil:
			s += ":err"
		case r.Reserved:
			s += ":reserved"
		case r.Exit != nil:
			s += fmt.Sprintf(":exit %d", r.Exit.Code)
		default:
			s += fmt.Sprintf(":running %d gpus", len(r.GPUs))
		}
		if r.Supervisor != nil && *r.Supervisor == n.c.rt.self {
			s += ":mine"
		}
		got = append(got, s)
	}
	want := []string{"broken:err:mine", "ended:exit 3:mine", "reserved:reserved:mine", "runs:running 2 gpus:mine", "vanished:exit 137"}
	if !slices.Equal(got, want) {
		t.Fatalf("listed %v, want %v", got, want)
	}
	os.RemoveAll(filepath.Join(n.state, "vanished"))
	os.RemoveAll(filepath.Join(n.state, "reserved"))
	if err := n.c.rt.writeRecord(ctrRecord{ID: "broken"}); err != nil {
		t.Fatal(err)
	}
}
