package allocator_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/node"
)

// FuzzParseConstraint: parsing never panics, a parsed constraint
// round-trips through String, and evaluating it never panics.
func FuzzParseConstraint(f *testing.F) {
	for _, s := range []string{"memory >= 16 GiB", "model regexp V100", "mig is_not_set", "driver_version version >= 535, < 550",
		"${device.attr.power} < 0.3 kW", "features set_contains a,b", "x = ", "= = ="} {
		f.Add(s)
	}
	d := v100()
	f.Fuzz(func(t *testing.T, s string) {
		c, err := allocator.ParseConstraint(s)
		if err != nil {
			if !errors.Is(err, allocator.ErrInvalidConstraint) {
				t.Fatalf("%q: untyped error %v", s, err)
			}
			return
		}
		back, err := allocator.ParseConstraint(c.String())
		if err != nil || back.Attribute != c.Attribute || back.Operator != c.Operator {
			t.Fatalf("%q: %q does not parse back: %v", s, c.String(), err)
		}
		c.Matches(d)
		c.Matches(&node.Device{})
	})
}

// FuzzAllocateRequest decodes a JSON request and allocates it: never a
// panic, an error leaves the allocator empty, a success holds what was
// asked and keeps the invariants.
func FuzzAllocateRequest(f *testing.F) {
	for _, s := range []string{`{"count":2}`, `{"count":1,"devices":["0"]}`, `{"devices":["GPU-x","1"]}`,
		`{"count":2,"model":"nvidia/gpu/Tesla V100-SXM2-16GB","constraints":[{"attribute":"memory","operator":">=","value":"8 GiB"}]}`,
		`{"count":1,"affinities":[{"attribute":"index","operator":"=","value":"5","weight":-50}]}`,
		`{"memoryBytes":1073741824}`, `{"count":-3}`, `{"count":3,"group":"g"}`} {
		f.Add([]byte(s))
	}
	inv := simInv(f, "dgx1-volta")
	f.Fuzz(func(t *testing.T, b []byte) {
		var r allocator.Request
		if json.Unmarshal(b, &r) != nil {
			return
		}
		a, err := allocator.New(inv, allocator.WithShared("7"), allocator.WithQuota("g", 2))
		if err != nil {
			t.Fatal(err)
		}
		al, err := a.Allocate(context.Background(), "fuzz", r)
		if err != nil {
			if len(a.Allocations()) != 0 {
				t.Fatalf("%s: failed request applied: %v", b, err)
			}
			return
		}
		want := r.Count
		if want == 0 {
			want = len(r.Devices)
		}
		if r.MemoryBytes > 0 {
			want = 1
		}
		if len(al.Devices) != want {
			t.Fatalf("%s: got %d GPUs", b, len(al.Devices))
		}
		if err := allocator.CheckInvariants(a); err != nil {
			t.Fatal(err)
		}
	})
}
