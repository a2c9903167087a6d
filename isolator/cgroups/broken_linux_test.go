package cgroups_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/isolator/cgroups"
)

// mismatches opens every GPU and control node from inside the cgroup and
// lists those whose result differs from what allowed says (ENXIO: allowed,
// no driver behind the simulated major; EPERM: denied).
func (f *fixture) mismatches(p *testenv.Prober, allowed ...int) []string {
	var bad []string
	for i := range f.inv.Devices {
		want := "EPERM"
		if slices.Contains(allowed, i) {
			want = "ENXIO"
		}
		if got, err := p.Open(f.node(fmt.Sprintf("nvidia%d", i))); err != nil || got != want {
			bad = append(bad, fmt.Sprintf("nvidia%d %s (want %s)", i, got, want))
		}
	}
	for _, c := range f.inv.ControlDevices {
		if got, _ := p.Open(c.Path); got != "ENXIO" {
			bad = append(bad, fmt.Sprintf("%s %s (want ENXIO)", c.Name, got))
		}
	}
	return bad
}

// TestBrokenRuleCaught is the negative control of the isolation checks: a
// device program (or v1 allow list) with one allowed device taken out, as
// a bug in the rules would leave it, is caught by the very check the other
// tests pass: the GPU the container owns is denied (EPERM), and nothing
// else changes.
func TestBrokenRuleCaught(t *testing.T) {
	versions(t, func(t *testing.T, v cgroups.Version) {
		f := newFixture(t, v)
		ctx := context.Background()
		const owner = "broken"
		if err := f.iso.Apply(ctx, owner, f.rules(1, 3)); err != nil {
			t.Fatal(err)
		}
		defer f.iso.Destroy(ctx, owner)
		p := testenv.StartProber(t, func(pid int) error { return f.iso.AddProcess(ctx, owner, pid) })
		if bad := f.mismatches(p, 1, 3); len(bad) != 0 {
			t.Fatalf("the correct rules fail the check: %v", bad)
		}
		gpu3 := isolator.Allow(int64(f.inv.Devices[3].Node.Major), int64(f.inv.Devices[3].Node.Minor), "rwm")
		broken := slices.DeleteFunc(f.rules(1, 3), func(r isolator.Rule) bool { return r == gpu3 })
		if len(broken) != len(f.rules(1, 3))-1 {
			t.Fatalf("rule %s not in %v", gpu3, f.rules(1, 3))
		}
		if err := f.iso.Apply(ctx, owner, broken); err != nil {
			t.Fatal(err)
		}
		bad := f.mismatches(p, 1, 3)
		if len(bad) != 1 || !strings.HasPrefix(bad[0], "nvidia3 EPERM") {
			t.Fatalf("the check of rules without GPU 3's found %v, want exactly nvidia3 denied", bad)
		}
		t.Logf("caught: %s", bad[0])
	})
}
