package cgroups_test

import (
	"testing"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/isolator/cgroups"
)

// TestZeroValues: an Isolator not made with New refuses every call.
func TestZeroValues(t *testing.T) {
	testenv.ZeroValueSafe(t, []any{&cgroups.Isolator{}})
}
