package allocator_test

import (
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
)

// TestZeroValues: an Allocator not made with New refuses every call.
func TestZeroValues(t *testing.T) {
	testenv.ZeroValueSafe(t, []any{&allocator.Allocator{}})
}
