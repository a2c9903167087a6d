package containerizer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
)

func resizeAllocator(t *testing.T) *allocator.Allocator {
	t.Helper()
	sim, err := simnode.New("pcie8")
	if err != nil {
		t.Fatal(err)
	}
	inv, err := nvmlnode.Discover(context.Background(), nvmlnode.WithNVML(sim.NVML()))
	if err != nil {
		t.Fatal(err)
	}
	a, err := allocator.New(inv)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// resizeLog records, at each Enforce and Commit, what the container is
// allowed and what the allocator holds for it then.
type resizeLog struct {
	a       *allocator.Allocator
	steps   []string
	failAt  int // the Enforce call (1-based) that fails; 0: none; -1: every one
	enforce int
}

func (l *resizeLog) held() int {
	al, err := l.a.Allocation("c")
	if err != nil {
		return 0
	}
	return len(al.Devices)
}

func (l *resizeLog) step() containerizer.Resize {
	return containerizer.Resize{Allocator: l.a, Owner: "c",
		Enforce: func(_ context.Context, gpus []node.DeviceRef) error {
			l.enforce++
			l.steps = append(l.steps, fmt.Sprintf("allow %d (held %d)", len(gpus), l.held()))
			if l.enforce == l.failAt || l.failAt < 0 {
				return errors.New("enforce failed")
			}
			return nil
		},
		Commit: func(al allocator.Allocation) error {
			l.steps = append(l.steps, fmt.Sprintf("record %d (held %d)", len(al.Devices), l.held()))
			return nil
		},
	}
}

// TestResizeOrder: a grow holds the GPUs before it allows them, a shrink
// denies the GPUs that go before it frees them, so that no GPU is ever
// allowed to a container that does not hold it; a failed step leaves the
// container holding, and allowed, what it had: a failed grow denies the
// new GPUs before it gives them back, and keeps them held while it cannot.
func TestResizeOrder(t *testing.T) {
	for _, tc := range []struct {
		name   string
		from   int
		to     int
		failAt int
		want   string
		held   int
	}{
		{"grow from none", 0, 2, 0, "record 2 (held 2); allow 2 (held 2)", 2},
		{"grow", 1, 3, 0, "record 3 (held 3); allow 3 (held 3)", 3},
		{"shrink", 3, 1, 0, "allow 1 (held 3); record 1 (held 1)", 1},
		{"shrink to none", 2, 0, 0, "allow 0 (held 2); record 0 (held 0)", 0},
		{"same", 2, 2, 0, "", 2},
		{"grow, enforce fails", 1, 3, 1, "record 3 (held 3); allow 3 (held 3); allow 1 (held 3); record 1 (held 1)", 1},
		{"grow from none, enforce fails", 0, 2, 1, "record 2 (held 2); allow 2 (held 2); allow 0 (held 2); record 0 (held 0)", 0},
		{"grow, enforce and its undo fail", 1, 3, -1, "record 3 (held 3); allow 3 (held 3); allow 1 (held 3)", 3},
		{"shrink, enforce fails", 3, 1, 1, "allow 1 (held 3); allow 3 (held 3)", 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := resizeAllocator(t)
			if tc.from > 0 {
				if _, err := a.Allocate(t.Context(), "c", allocator.Request{Count: tc.from}); err != nil {
					t.Fatal(err)
				}
			}
			l := &resizeLog{a: a, failAt: tc.failAt}
			al, err := l.step().To(t.Context(), tc.to)
			if (err != nil) != (tc.failAt != 0) {
				t.Fatalf("To(%d) = %+v, %v", tc.to, al, err)
			}
			if got := strings.Join(l.steps, "; "); got != tc.want {
				t.Errorf("steps %q\nwant  %q", got, tc.want)
			}
			if l.held() != tc.held || (err == nil && len(al.Devices) != tc.to) || (err != nil && len(al.Devices) != 0 && len(al.Devices) != tc.held) {
				t.Errorf("holds %d, returned %d devices; want %d", l.held(), len(al.Devices), tc.held)
			}
		})
	}
}

// TestResizeHolder: an owner that held nothing grows with the step's
// holder; a negative count is refused with node.ErrInvalid.
func TestResizeHolder(t *testing.T) {
	a := resizeAllocator(t)
	h := &allocator.Holder{Pid: 42, Start: 4242}
	r := containerizer.Resize{Allocator: a, Owner: "c", Holder: h, Enforce: func(context.Context, []node.DeviceRef) error { return nil }}
	if _, err := r.To(t.Context(), 1); err != nil {
		t.Fatal(err)
	}
	al, err := a.Allocation("c")
	if err != nil || al.Holder == nil || *al.Holder != *h {
		t.Fatalf("allocation %+v, %v", al, err)
	}
	if _, err := r.To(t.Context(), -1); !errors.Is(err, node.ErrInvalid) {
		t.Errorf("To(-1) = %v", err)
	}
}

// TestResizeShrinkCommitFails: a shrink whose Commit fails after the
// release is done, not undone: To returns the smaller allocation the owner
// holds now with the error, so the caller's record can follow it.
func TestResizeShrinkCommitFails(t *testing.T) {
	a := resizeAllocator(t)
	if _, err := a.Allocate(t.Context(), "c", allocator.Request{Count: 3}); err != nil {
		t.Fatal(err)
	}
	step := containerizer.Resize{
		Allocator: a, Owner: "c",
		Enforce: func(context.Context, []node.DeviceRef) error { return nil },
		Commit:  func(allocator.Allocation) error { return errors.New("disk full") },
	}
	al, err := step.To(t.Context(), 1)
	if err == nil {
		t.Fatal("a failed Commit is no error")
	}
	held, aerr := a.Allocation("c")
	if aerr != nil {
		t.Fatal(aerr)
	}
	if len(al.Devices) != 1 || len(held.Devices) != 1 || al.Devices[0].UUID != held.Devices[0].UUID {
		t.Errorf("returned %+v with %v; the owner holds %+v", al.Devices, err, held.Devices)
	}
}
