package simnode

import (
	"context"
	"fmt"
	"strings"

	"github.com/gpuiso/gpuiso/node"
)

// ErrResetFault is why a simulated GPU's reset fails after FailResets. It
// matches node.ErrUnavailable.
var ErrResetFault = node.Sentinel(node.ErrUnavailable, "simulated reset fault")

// ResetGPU resets the simulated GPU gpu (found by UUID, else bus id, else
// index), as node.Resetter asks: it is healed as Clear heals it, unless
// FailResets made its resets fail, and then it stays as it is and the
// error is a *node.ResetError wrapping ErrResetFault. Every reset asked is
// counted (Resets), a failed one too. With ShareFaults, in the host tree,
// so that a reset made by one process shows in every node over the tree.
// A GPU the node does not have is ErrNoSuchGPU.
func (n *Node) ResetGPU(ctx context.Context, gpu node.Device) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("reset GPU %s: %w", gpu.UUID, err)
	}
	i := n.gpuIndex(gpu)
	if i < 0 {
		return fmt.Errorf("reset GPU %s (%s): %w", gpu.UUID, gpu.BusID, ErrNoSuchGPU)
	}
	failed := false
	err := n.changeFaults(i, func(f *gpuFaults) {
		f.Resets++
		if f.ResetFails {
			failed = true
			return
		}
		*f = f.clear()
	})
	name := n.UUID(i)
	if err != nil {
		return &node.ResetError{GPU: name, Err: err}
	}
	if failed {
		return &node.ResetError{GPU: name, Err: ErrResetFault}
	}
	return nil
}

// gpuIndex is the index of the GPU d names: by UUID, else bus id, else
// index; -1 when the node has none.
func (n *Node) gpuIndex(d node.Device) int {
	for i := range n.Len() {
		if d.UUID != "" && d.UUID == n.UUID(i) {
			return i
		}
	}
	if d.UUID != "" {
		return -1
	}
	for i, g := range n.spec.GPUs {
		if d.BusID != "" && (strings.EqualFold(g.BusID, d.BusID) || strings.EqualFold("0000"+g.BusID, d.BusID)) {
			return i
		}
	}
	if d.BusID == "" && d.Index >= 0 && d.Index < n.Len() {
		return d.Index
	}
	return -1
}

// FailResets makes the resets of GPU i fail (fail true) or succeed (the
// default). With ShareFaults, in the host tree: gpuinfo --inject
// 'reset fail' sets it from another process.
func (n *Node) FailResets(i int, fail bool) error {
	if i < 0 || i >= n.Len() {
		return fmt.Errorf("set the reset mode of GPU %d of %d: %w", i, n.Len(), ErrNoSuchGPU)
	}
	if err := n.changeFaults(i, func(f *gpuFaults) { f.ResetFails = fail }); err != nil {
		return fmt.Errorf("set the reset mode of GPU %d: %w", i, err)
	}
	return nil
}

// Resets is how many resets of GPU i were asked (ResetGPU), failed ones
// too; with ShareFaults, by any node over the host tree. 0 for a GPU the
// node does not have.
func (n *Node) Resets(i int) int {
	if i < 0 || i >= n.Len() {
		return 0
	}
	return n.faultsOf(i).Resets
}
