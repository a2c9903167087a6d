package native

import (
	"errors"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
)

// TestBackend: Backend builds a native containerizer over the composite's
// allocator and node, and refuses a configuration with another allocator or
// one that reconciles it alone. No root needed.
func TestBackend(t *testing.T) {
	n := newBareNode(t)
	other, err := allocator.New(n.inv)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		cfg  Config
		want error
	}{
		{"allocator from the composite", Config{Isolator: n.iso, StateDir: t.TempDir()}, nil},
		{"the same allocator named", Config{Allocator: n.alloc, Isolator: n.iso, StateDir: t.TempDir()}, nil},
		{"another allocator", Config{Allocator: other, Isolator: n.iso, StateDir: t.TempDir()}, containerizer.ErrAllocatorMismatch},
		{"reconciling alone", Config{Isolator: n.iso, StateDir: t.TempDir(), ReconcileAllocator: true}, containerizer.ErrAllocatorMismatch},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			kind, z, err := Backend(tc.cfg)(n.alloc)
			if kind != containerizer.KindNative {
				t.Fatalf("kind %q", kind)
			}
			if tc.want != nil {
				if !errors.Is(err, tc.want) || z != nil {
					t.Fatalf("built %v, %v; want %v", z, err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			c := z.(*Containerizer)
			if c.Allocator() != n.alloc || c.rt.cfg.Inventory == nil || len(c.rt.cfg.Inventory.Devices) != len(n.inv.Devices) {
				t.Fatalf("built over %p with %v, want the composite's allocator %p", c.Allocator(), c.rt.cfg.Inventory, n.alloc)
			}
			if _, err := containerizer.NewComposite(n.alloc, c, nil); err != nil {
				t.Fatalf("a composite over it: %v", err)
			}
			if _, err := containerizer.NewComposite(other, c, nil); !errors.Is(err, containerizer.ErrAllocatorMismatch) {
				t.Fatalf("a composite over another allocator: %v", err)
			}
		})
	}
}
