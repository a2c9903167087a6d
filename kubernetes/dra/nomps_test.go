package dra_test

import (
	"testing"

	"github.com/gpuiso/gpuiso/isolator/mps"
	"github.com/gpuiso/gpuiso/kubernetes/dra"
)

// TestErrNoMPS: the driver's older name for a share without a daemon
// manager is the one value every program returns for it.
func TestErrNoMPS(t *testing.T) {
	if dra.ErrNoMPS != mps.ErrNoManager {
		t.Fatalf("dra.ErrNoMPS %v is not mps.ErrNoManager %v", dra.ErrNoMPS, mps.ErrNoManager)
	}
}
