package mps_test

import (
	"context"
	"testing"

	"github.com/gpuiso/gpuiso/isolator/mps"
)

// TestDaemonsWithoutManager: Daemons reads a manager's directory without a
// manager of its own: an existing directory with no daemon lists none, no
// error (a program that only shows the daemons, such as gpuinfo, relies
// on it).
func TestDaemonsWithoutManager(t *testing.T) {
	list, err := mps.Daemons(context.Background(), t.TempDir())
	if err != nil || len(list) != 0 {
		t.Fatalf("Daemons of an empty directory = %v, %v; want none, no error", list, err)
	}
}
