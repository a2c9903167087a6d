package main

import (
	"context"

	"github.com/gpuiso/gpuiso/internal/cli"
	"github.com/gpuiso/gpuiso/node"
)

// openNode discovers the node gpuiso-runtime runs on: the host's, or the
// simulated node s names, whose host tree under s.DevRoot (--sim-root) is
// made on first use and kept (cli.OpenSharedNode), so that every call sees
// the same device nodes; a directory that another user owns or may write
// in, as any parent of it, is refused (simnode.ErrUntrusted). It returns
// the inventory and the directory holding the node's device nodes.
func openNode(ctx context.Context, s Settings) (*node.Inventory, string, error) {
	nd, err := cli.OpenSharedNode(ctx, s.Simulate, s.DevRoot)
	if err != nil {
		return nil, "", err
	}
	return nd.Inventory, nd.DevRoot, nil
}
