package node_test

import (
	"testing"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/node"
)

// TestZeroValues: the model's zero values answer without panicking.
func TestZeroValues(t *testing.T) {
	testenv.ZeroValueSafe(t, []any{&node.Inventory{}, &node.Topology{}, &node.Device{}, &node.Attribute{}, &node.Health{}})
}
