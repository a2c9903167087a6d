package native

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
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
			if err := writeJSON(filepath.Join(dir, supervisorFile), tc.sup); err != nil {
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
