package allocator

import (
	"errors"
	"testing"

	"github.com/gpuiso/gpuiso/node"
)

func stateFuzzInventory(t testing.TB) *node.Inventory {
	links := make([][]node.Link, 4)
	for i := range links {
		links[i] = make([]node.Link, 4)
		for j := range links[i] {
			if i != j {
				links[i][j] = node.Link{PCIe: node.PCIeSingleSwitch, NVLinks: (i + j) % 2}
			}
		}
	}
	topo, err := node.NewTopology(links)
	if err != nil {
		t.Fatal(err)
	}
	inv := &node.Inventory{Topology: topo}
	for i := range 4 {
		inv.Devices = append(inv.Devices, node.Device{Index: i, Minor: i, UUID: "GPU-" + string(rune('a'+i)),
			BusID: "0000:0" + string(rune('1'+i)) + ":00.0", MemoryBytes: 1 << 30, NUMANode: i / 2, Health: node.Healthy()})
	}
	return inv
}

// FuzzDecodeState: decoding never panics, every rejection is an
// ErrCorruptState, and what decodes either loads into a consistent
// allocator or is refused with ErrCorruptState, then re-encodes to a state
// that decodes to the same thing.
func FuzzDecodeState(f *testing.F) {
	inv := stateFuzzInventory(f)
	a, err := New(inv, WithShared("3"))
	if err != nil {
		f.Fatal(err)
	}
	good, _ := encodeState(&savedState{
		Owners: []savedOwner{
			{Owner: "a", Group: "g", Devices: []savedDevice{{Index: 0, UUID: "GPU-a"}, {Index: 1, UUID: "GPU-b"}}},
			{Owner: "s", Shared: &savedDevice{Index: 3, UUID: "GPU-d"}, MemoryBytes: 1 << 20},
		},
		Unhealthy: []savedHealth{{Device: savedDevice{Index: 2, UUID: "GPU-c"}, Reason: "XID 79"}},
	})
	f.Add(good)
	f.Add(good[:len(good)/2])
	f.Add([]byte(`{"format":"gpuiso.allocator.state","version":1,"checksum":"sha256:","state":{}}`))
	f.Add([]byte{})
	_ = a
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := decodeState(b)
		if err != nil {
			if !errors.Is(err, ErrCorruptState) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		a, err := New(inv, WithShared("3"))
		if err != nil {
			t.Fatal(err)
		}
		if err := a.restore(s); err != nil {
			if !errors.Is(err, ErrCorruptState) {
				t.Fatalf("untyped restore error %v", err)
			}
			return
		}
		if err := a.checkInvariants(); err != nil {
			t.Fatalf("restored state inconsistent: %v", err)
		}
		again, err := encodeState(a.snapshot())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := decodeState(again); err != nil {
			t.Fatalf("re-encoded state does not decode: %v", err)
		}
	})
}
