package cli

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/simnode"
)

// TestOpenSharedNode: concurrent calls make a simulated node's tree once and
// see the same device nodes; Close leaves the tree for the next call (the
// tree's own cases are simnode's TestOpenHost).
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
}

// TestOpenSharedNodeRefusesUserDir: a --dev-root holding a user's files
// (one beside where the tree would go, one in its dev) is refused with one
// line naming the directory, and every file stays; so is the host's own
// root directory. The refusal comes before anything is made: no root
// needed.
func TestOpenSharedNodeRefusesUserDir(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{"notes.txt": "mine\n", "dev/keep": "mine too\n"}
	for p, body := range files {
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	nd, err := OpenSharedNode(context.Background(), "dgx1-volta", dir)
	if err == nil {
		nd.Close()
		t.Fatal("a directory holding a user's files was taken for a simulated node")
	}
	if !errors.Is(err, simnode.ErrNotOwned) || !errors.Is(err, node.ErrExists) {
		t.Errorf("error %v does not match simnode.ErrNotOwned and node.ErrExists", err)
	}
	if msg := err.Error(); strings.Contains(msg, "\n") || !strings.Contains(msg, dir) || !strings.Contains(msg, "dgx1-volta") || strings.Contains(msg, "needs root") {
		t.Errorf("error %q is not one line naming the node and %s", msg, dir)
	}
	for p, body := range files {
		if b, err := os.ReadFile(filepath.Join(dir, p)); err != nil || string(b) != body {
			t.Errorf("the user's %s: %q, %v; want %q", p, b, err, body)
		}
	}
	if list, _ := os.ReadDir(dir); len(list) != len(files) {
		t.Errorf("%s holds %d entries, want the user's %d", dir, len(list), len(files))
	}
	if _, err := OpenSharedNode(context.Background(), "dgx1-volta", "/"); !errors.Is(err, simnode.ErrHostPath) {
		t.Errorf("OpenSharedNode on / = %v, want simnode.ErrHostPath", err)
	}
}
