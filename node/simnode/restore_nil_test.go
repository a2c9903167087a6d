package simnode_test

import (
	"errors"
	"testing"

	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/simnode"
)

// TestRestoreMIGNilHost: RestoreMIG without a host tree is refused with
// node.ErrInvalid (it has no record to read) and changes nothing.
func TestRestoreMIGNilHost(t *testing.T) {
	sim, err := simnode.New("hgx-h100-dynmig")
	if err != nil {
		t.Fatal(err)
	}
	before := len(sim.MIGDevices(1))
	if err := sim.RestoreMIG(nil); !errors.Is(err, node.ErrInvalid) {
		t.Fatalf("RestoreMIG(nil): %v, want %v", err, node.ErrInvalid)
	}
	if got := len(sim.MIGDevices(1)); got != before {
		t.Fatalf("GPU 1 has %d MIG devices, had %d", got, before)
	}
}
