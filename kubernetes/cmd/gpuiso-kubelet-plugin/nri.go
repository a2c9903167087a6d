package main

import (
	"context"
	"flag"
	"log/slog"

	"github.com/containerd/nri/pkg/api"

	"github.com/gpuiso/gpuiso/kubernetes/nri"
	"github.com/gpuiso/gpuiso/node"
)

// nriFlags configure the NRI plugin, which places containers holding GPUs
// on their GPUs' NUMA nodes.
type nriFlags struct {
	policy string
	socket string
}

func (n *nriFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&n.policy, "nri-policy", string(nri.PolicyNone), "NRI: `POLICY` for containers holding GPUs: none, or numa (their CPUs and memory nodes those of their GPUs' NUMA nodes, set through the container runtime's NRI before they start)")
	fs.StringVar(&n.socket, "nri-socket", api.DefaultSocketPath, "NRI: the container runtime's NRI `SOCKET`, with --nri-policy numa")
}

// check returns the reason the NRI flags are refused, or "".
func (n *nriFlags) check() string {
	if _, err := nri.ParsePolicy(n.policy); err != nil {
		return "--nri-policy: " + err.Error()
	}
	return ""
}

// start serves the NRI plugin until ctx ends, with policy numa; sysRoot
// lists the node's NUMA nodes (a simulated node's own).
func (n *nriFlags) start(ctx context.Context, inv *node.Inventory, sysRoot string, log *slog.Logger) error {
	if nri.Policy(n.policy) != nri.PolicyNUMA {
		return nil
	}
	p, err := nri.New(inv, nri.PolicyNUMA, sysRoot, log)
	if err != nil {
		return err
	}
	go nri.Serve(ctx, n.socket, p, log)
	return nil
}
