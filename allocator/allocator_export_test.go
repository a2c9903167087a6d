package allocator

// CheckInvariants exposes the allocator's consistency check to the tests.
func CheckInvariants(a *Allocator) error { return a.checkInvariants() }

// SetScoreOf is the link score of a set of positions as the allocator
// computes it.
func SetScoreOf(a *Allocator, set []int) int64 {
	var m uint64
	for _, p := range set {
		m |= 1 << p
	}
	return a.setScore(m)
}

// Choose runs the placement of policy over the candidate positions, without
// changing the allocator.
func Choose(a *Allocator, policy Policy, cands []int, must []int, k int, aff []int64) []int {
	var c, m uint64
	for _, p := range cands {
		c |= 1 << p
	}
	for _, p := range must {
		m |= 1 << p
	}
	hasAff := false
	for _, w := range aff {
		hasAff = hasAff || w != 0
	}
	return a.positions(a.choose(policy, c|m, m, k, aff, hasAff))
}
