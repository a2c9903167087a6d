package testenv

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
)

// SimulatedNode builds the shipped simulated node name with its host tree
// (device nodes with NVIDIA's numbers) in a temporary directory of tb, and
// returns the node, its host and the inventory Discover reads from them.
// It needs root for the device nodes and calls RequireRoot.
func SimulatedNode(tb testing.TB, name string) (*simnode.Node, *simnode.Host, *node.Inventory) {
	tb.Helper()
	RequireRoot(tb)
	node, err := simnode.New(name)
	if err != nil {
		tb.Fatal(err)
	}
	// A host tree is made only where no other user may write (simnode
	// refuses one that another user could point at other devices); the
	// test's temporary directories are so whatever the test's umask.
	dir := tb.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			tb.Fatal(err)
		}
	}
	host, err := node.MakeHost(dir)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { host.Remove() })
	inv, err := nvmlnode.Discover(context.Background(), node.DiscoverOptions(host)...)
	if err != nil {
		tb.Fatal(err)
	}
	return node, host, inv
}
