package allocator_test

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/node"
)

// holdLock makes an allocator on dir hold the directory's lock until the
// test ends.
func holdLock(t *testing.T, dir string) {
	t.Helper()
	holder := newAlloc(t, "dgx1-volta", allocator.WithStateDir(dir))
	held, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- holder.Exclusive(context.Background(), func() error {
			close(held)
			<-release
			return nil
		})
	}()
	t.Cleanup(func() {
		close(release)
		if err := <-done; err != nil {
			t.Error(err)
		}
		holder.Close()
	})
	<-held
}

// TestLockWaitEndsWithContext: while another allocator holds the state
// directory's lock, every change waits no longer than its context and
// fails with a *LockError naming the holder (this process) that matches
// ErrLocked, node.ErrUnavailable and the context's error; nothing changes.
func TestLockWaitEndsWithContext(t *testing.T) {
	dir := t.TempDir()
	a := newAlloc(t, "dgx1-volta", allocator.WithStateDir(dir))
	defer a.Close()
	holdLock(t, dir)
	for name, change := range map[string]func(ctx context.Context) error{
		"allocate": func(ctx context.Context) error {
			_, err := a.Allocate(ctx, "x", allocator.Request{Count: 1})
			return err
		},
		"release dead": func(ctx context.Context) error {
			_, err := a.ReleaseDead(ctx)
			return err
		},
		"exclusive": func(ctx context.Context) error {
			return a.Exclusive(ctx, func() error { return nil })
		},
	} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			err := change(ctx)
			var le *allocator.LockError
			if !errors.As(err, &le) {
				t.Fatalf("err = %v, want a *LockError", err)
			}
			if !errors.Is(err, allocator.ErrLocked) || !errors.Is(err, node.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("err %v does not match ErrLocked, node.ErrUnavailable and context.DeadlineExceeded", err)
			}
			if le.Holder == nil || le.Holder.Pid != os.Getpid() || le.Command == "" || le.Dir != dir {
				t.Errorf("LockError %+v (holder %+v): want this process as the holder, with its command, in %s", le, le.Holder, dir)
			}
		})
	}
	if len(a.Allocations()) != 0 {
		t.Errorf("allocations %v after waits that ended", a.Allocations())
	}
}

// TestNewDoesNotWaitForLock: New on a directory whose lock another
// allocator holds reads the state and returns without waiting.
func TestNewDoesNotWaitForLock(t *testing.T) {
	dir := t.TempDir()
	first := newAlloc(t, "dgx1-volta", allocator.WithStateDir(dir))
	if _, err := first.Allocate(context.Background(), "held", allocator.Request{Devices: []string{"3"}}); err != nil {
		t.Fatal(err)
	}
	first.Close()
	holdLock(t, dir)
	made := make(chan *allocator.Allocator, 1)
	go func() {
		a, err := allocator.New(simInv(t, "dgx1-volta"), allocator.WithStateDir(dir))
		if err != nil {
			t.Error(err)
		}
		made <- a
	}()
	select {
	case a := <-made:
		if a == nil {
			return
		}
		defer a.Close()
		if got := a.Allocations(); len(got) != 1 || got[0].Owner != "held" {
			t.Errorf("allocations %v, want held's", got)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("New waits for a lock another allocator holds")
	}
}
