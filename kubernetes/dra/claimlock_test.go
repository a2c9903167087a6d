package dra

import (
	"testing"
	"time"
)

// TestClaimLocks: an operation on one claim waits for the one before on
// the same claim, never for another claim's; the locks of claims no one
// works on are forgotten.
func TestClaimLocks(t *testing.T) {
	var c claimLocks
	unlockA := c.lock("a")
	// Another claim goes ahead while a is held.
	done := make(chan struct{})
	go func() {
		c.lock("b")()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("claim b waited for claim a")
	}
	// The same claim waits until a's turn ends.
	got := make(chan struct{})
	go func() {
		c.lock("a")()
		close(got)
	}()
	select {
	case <-got:
		t.Fatal("a second operation on claim a did not wait for the first")
	case <-time.After(50 * time.Millisecond):
	}
	unlockA()
	<-got
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.locks) != 0 {
		t.Errorf("locks left: %v", c.locks)
	}
}
