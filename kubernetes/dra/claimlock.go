package dra

import "sync"

// claimLocks lets one operation at a time work on a claim, while other
// claims' operations go on: their checkpoint writes (each synced to disk)
// then overlap, and the node's state (the allocator, MIG devices, MPS
// daemons, under Driver.mu) is held only for the steps that change it.
type claimLocks struct {
	mu    sync.Mutex
	locks map[string]*claimLock
}

type claimLock struct {
	sync.Mutex
	users int
}

// lock waits until no other operation works on claim uid, and returns the
// function that ends this one's turn.
func (c *claimLocks) lock(uid string) func() {
	c.mu.Lock()
	if c.locks == nil {
		c.locks = map[string]*claimLock{}
	}
	l := c.locks[uid]
	if l == nil {
		l = &claimLock{}
		c.locks[uid] = l
	}
	l.users++
	c.mu.Unlock()
	l.Lock()
	return func() {
		l.Unlock()
		c.mu.Lock()
		if l.users--; l.users == 0 {
			delete(c.locks, uid)
		}
		c.mu.Unlock()
	}
}
