package containerizer_test

import (
	"context"
	"errors"
	"testing"

	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/node"
)

// TestReleaseVolumeBadOwner: an owner id no container can have is refused
// with its kind, with or without a manager, rather than taken as no one.
func TestReleaseVolumeBadOwner(t *testing.T) {
	for _, owner := range []string{"", "a/b", ".."} {
		if err := containerizer.ReleaseVolume(context.Background(), nil, owner, ""); !errors.Is(err, node.ErrInvalid) {
			t.Errorf("owner %q: %v, want node.ErrInvalid", owner, err)
		}
	}
}
