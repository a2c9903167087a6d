package node_test

import (
	"errors"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/containerizer/chain"
	"github.com/gpuiso/gpuiso/isolator/cgroups"
	"github.com/gpuiso/gpuiso/isolator/mps"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/record"
	"github.com/gpuiso/gpuiso/volume"
)

// TestNotMade: one check, errors.Is(err, node.ErrNotMade), covers every
// package's value not made with its constructor, and each keeps its own
// message and identity.
func TestNotMade(t *testing.T) {
	for name, err := range map[string]error{
		"allocator": allocator.ErrNotMade, "containerizer": containerizer.ErrNotMade, "chain": chain.ErrNotMade,
		"cgroups": cgroups.ErrNotMade, "mps": mps.ErrNotMade, "record": record.ErrNotMade, "volume": volume.ErrNotMade,
	} {
		if !errors.Is(err, node.ErrNotMade) || !errors.Is(err, node.ErrInvalid) || !errors.Is(err, err) {
			t.Errorf("%s.ErrNotMade (%v) does not match node.ErrNotMade and node.ErrInvalid", name, err)
		}
		if errors.Is(err, node.ErrNotFound) || err.Error() == node.ErrNotMade.Error() {
			t.Errorf("%s.ErrNotMade: %q", name, err)
		}
	}
	if errors.Is(allocator.ErrNotMade, volume.ErrNotMade) {
		t.Error("two packages' ErrNotMade match each other")
	}
	if !errors.Is(node.ErrNotMade, node.ErrInvalid) {
		t.Error("node.ErrNotMade does not match node.ErrInvalid")
	}
}
