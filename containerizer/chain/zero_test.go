package chain

import (
	"testing"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
)

// TestZeroValues: an Isolator not made with New refuses every call with an
// error instead of panicking (and touches no path).
func TestZeroValues(t *testing.T) {
	testenv.ZeroValueSafe(t, []any{&Isolator{}, (*Isolator)(nil)})
}
