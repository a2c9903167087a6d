package nvmlnode_test

import (
	"context"
	"errors"
	"testing"

	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
)

// TestMIGManagerZero: a MIGManager not made by NewMIGManager refuses every
// call with node.ErrInvalid instead of panicking on its missing library.
func TestMIGManagerZero(t *testing.T) {
	ctx := context.Background()
	var m nvmlnode.MIGManager
	if _, err := m.CreateMIG(ctx, "GPU-x", "1g.10gb"); !errors.Is(err, node.ErrInvalid) {
		t.Errorf("CreateMIG: %v, want %v", err, node.ErrInvalid)
	}
	if _, err := m.CreateMIGAt(ctx, "GPU-x", "1g.10gb", 0); !errors.Is(err, node.ErrInvalid) {
		t.Errorf("CreateMIGAt: %v, want %v", err, node.ErrInvalid)
	}
	if err := m.DestroyMIG(ctx, "GPU-x", "MIG-x"); !errors.Is(err, node.ErrInvalid) {
		t.Errorf("DestroyMIG: %v, want %v", err, node.ErrInvalid)
	}
}
