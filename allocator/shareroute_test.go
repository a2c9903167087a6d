package allocator_test

import (
	"errors"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/node"
)

// TestShareImpossible: a share no GPU of the node could ever take is
// refused as impossible here (ErrShareNotSupported, ErrInvalidRequest),
// never as "not now" (ErrInsufficient), which would send a caller waiting
// for capacity to wait forever; a share that only does not fit now stays
// a *ShareError matching ErrInsufficient.
func TestShareImpossible(t *testing.T) {
	kinds := []error{node.ErrNotSupported, node.ErrInvalid, node.ErrExists, node.ErrNotFound, node.ErrInsufficient, node.ErrUnavailable, node.ErrCorrupt}
	inv := simInv(t, "rtx8000x4")
	mem := inv.Devices[0].MemoryBytes
	for _, tt := range []struct {
		name   string
		opts   []allocator.Option
		req    allocator.Request
		want   error
		kind   error
		before []allocator.Request
	}{
		{"no shareable gpu, memory", nil, allocator.Request{Share: memShare(gib)}, allocator.ErrShareNotSupported, node.ErrNotSupported, nil},
		{"no shareable gpu, time slice", nil, allocator.Request{Share: timeSlice()}, allocator.ErrShareNotSupported, node.ErrNotSupported, nil},
		{"no shareable gpu, MemoryBytes", nil, allocator.Request{MemoryBytes: gib}, allocator.ErrShareNotSupported, node.ErrNotSupported, nil},
		{"larger than every gpu", []allocator.Option{allocator.WithShared(allGPUs(inv)...)}, allocator.Request{Share: memShare(mem + gib)}, allocator.ErrInvalidRequest, node.ErrInvalid, nil},
		{"larger than every gpu, all free", []allocator.Option{allocator.WithShared("1")}, allocator.Request{MemoryBytes: 2 * mem}, allocator.ErrInvalidRequest, node.ErrInvalid, nil},
		{"no shareable gpu matches", []allocator.Option{allocator.WithShared("1")},
			allocator.Request{Share: memShare(gib), Constraints: []allocator.Constraint{{Attribute: "index", Operator: "=", Value: "2"}}}, allocator.ErrInvalidRequest, node.ErrInvalid, nil},
		{"full now", []allocator.Option{allocator.WithShared("1")}, allocator.Request{Share: memShare(2 * gib)}, allocator.ErrInsufficient, node.ErrInsufficient,
			[]allocator.Request{{Share: memShare(mem - gib)}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a := newAlloc(t, "rtx8000x4", tt.opts...)
			for i, r := range tt.before {
				allocOK(t, a, "before"+string(rune('a'+i)), r)
			}
			_, err := a.Allocate(t.Context(), "x", tt.req)
			var matched []string
			for _, k := range kinds {
				if errors.Is(err, k) {
					matched = append(matched, k.Error())
				}
			}
			if !errors.Is(err, tt.want) || len(matched) != 1 || !errors.Is(err, tt.kind) {
				t.Fatalf("Allocate = %v (kinds %q), want %v of kind %v alone", err, matched, tt.want, tt.kind)
			}
			var se *allocator.ShareError
			if errors.As(err, &se) != (tt.kind == node.ErrInsufficient) {
				t.Fatalf("Allocate = %v: a *ShareError only for a share that does not fit now", err)
			}
			if n := len(a.Allocations()); n != len(tt.before) {
				t.Fatalf("%d allocations after a refusal", n)
			}
		})
	}
}
