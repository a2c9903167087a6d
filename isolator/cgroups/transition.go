package cgroups

import (
	"slices"

	"github.com/gpuiso/gpuiso/isolator"
)

// v1Write is one write to a cgroup v1 devices controller file.
type v1Write struct {
	File  string // "devices.allow" or "devices.deny"
	Value string // a rule, "c 195:1 rwm", or "a" for everything
}

// v1Transition returns the writes that take a v1 devices cgroup from the
// allow rules it holds (its devices.list) to want: the pure half of the v1
// back end. A cgroup not yet confined (fresh, or holding an "a" rule, as a
// new cgroup inherits "a *:* rwm") is first denied everything and then
// gets want's allows. A confined one gets only the difference, allows
// first, so that a device allowed before and after is never denied in
// between.
func v1Transition(have, want []isolator.Rule, fresh bool) []v1Write {
	var out []v1Write
	if fresh || slices.ContainsFunc(have, func(r isolator.Rule) bool { return r.Type == 'a' }) {
		out = append(out, v1Write{"devices.deny", "a"})
		have = nil
	}
	for _, r := range want {
		if !slices.Contains(have, r) {
			out = append(out, v1Write{"devices.allow", r.String()})
		}
	}
	for _, r := range have {
		if !slices.Contains(want, r) {
			out = append(out, v1Write{"devices.deny", r.String()})
		}
	}
	return out
}
