package volume_test

import (
	"testing"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/volume"
)

// TestZeroValues: a Manager not made with New refuses every call; a zero
// Volume answers without panicking.
func TestZeroValues(t *testing.T) {
	testenv.ZeroValueSafe(t, []any{&volume.Manager{}, &volume.Volume{}})
}
