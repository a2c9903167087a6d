package cli

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/gpuiso/gpuiso/internal/testenv"
)

// TestOpenSharedNode: concurrent calls make a simulated node's tree once and
// see the same device nodes; a tree a killed call left half-made (no
// completion mark) is made again; Close leaves the tree for the next call.
func TestOpenSharedNode(t *testing.T) {
	testenv.RequireRoot(t)
	root := filepath.Join(t.TempDir(), "sim", "dgx1-volta")
	ctx := context.Background()
	var wg sync.WaitGroup
	majors := make([]uint32, 4)
	errs := make([]error, 4)
	for i := range majors {
		wg.Go(func() {
			nd, err := OpenSharedNode(ctx, "dgx1-volta", root)
			if err != nil {
				errs[i] = err
				return
			}
			defer nd.Close()
			majors[i] = nd.Inventory.Devices[0].Node.Major
		})
	}
	wg.Wait()
	for i := range majors {
		if errs[i] != nil || majors[i] != majors[0] || majors[i] == 0 {
			t.Fatalf("call %d: major %d, %v; want all equal to %d", i, majors[i], errs[i], majors[0])
		}
	}
	if _, err := os.Stat(filepath.Join(root, "dev", "nvidiactl")); err != nil {
		t.Fatalf("Close removed the shared node: %v", err)
	}
	// A killed call: the mark is missing, a stray file is in its /dev.
	if err := os.Remove(filepath.Join(root, sharedComplete)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "dev", "stray"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	nd, err := OpenSharedNode(ctx, "dgx1-volta", root)
	if err != nil {
		t.Fatal(err)
	}
	nd.Close()
	if _, err := os.Stat(filepath.Join(root, "dev", "stray")); err == nil {
		t.Error("a half-made tree was used as it was, not made again")
	}
	if _, err := os.Stat(filepath.Join(root, sharedComplete)); err != nil {
		t.Errorf("the remade tree is not marked complete: %v", err)
	}
}
