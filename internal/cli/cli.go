// Package cli holds what gpuiso's example programs share: the node they run
// on (real or simulated), their temporary directories, their command line's
// conventions and the lines a person reads.
//
// It serves the programs and sits below the library they use: it imports
// node (and its nvmlnode and simnode), internal/linux and the standard
// library, never allocator, volume, isolator or containerizer, whose
// results the programs combine themselves (TestLayer keeps it so).
package cli

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
)

// ExplainDiscover turns a discovery error into one line naming the cause
// and, when it is the driver, the way to run without one.
func ExplainDiscover(err error) string {
	const hint = "; run with --simulate dgx1-volta (or another shipped topology) to use a simulated node"
	switch {
	case errors.Is(err, nvmlnode.ErrLibraryNotFound):
		return "NVML library libnvidia-ml.so.1 not found: the NVIDIA driver is not installed on this host" + hint
	case errors.Is(err, nvmlnode.ErrDriverNotLoaded):
		return "NVIDIA kernel driver not loaded: the NVML library is installed but no driver answers (no GPU, or the module is not loaded)" + hint
	}
	return err.Error()
}

// Node is the node an example program runs on: the host's, or a simulated
// one whose host tree lives under a temporary directory until Close.
type Node struct {
	Inventory *node.Inventory
	// DevRoot holds the node's device nodes.
	DevRoot string
	// Where says which node it is, for the programs' one-line reports:
	// "" for the host, " of simulated NAME" otherwise.
	Where string
	dir   string
}

// OpenNode discovers the host's GPUs (simulate == "") or builds the
// simulated node of that name, which needs root for its device nodes. A
// host without a usable driver gives the ExplainDiscover line as error.
// opts configure the simulated node.
func OpenNode(ctx context.Context, simulate string, opts ...simnode.Option) (*Node, error) {
	return OpenNodeIn(ctx, simulate, "", opts...)
}

// OpenNodeIn is OpenNode with a simulated node's host tree in a temporary
// directory under dir (os.TempDir() when dir is ""), named by TempPattern
// so that RemoveDeadTempIn(dir, "") removes it once this process has died.
func OpenNodeIn(ctx context.Context, simulate, dir string, opts ...simnode.Option) (*Node, error) {
	if simulate == "" {
		inv, err := nvmlnode.Discover(ctx)
		if err != nil {
			return nil, errors.New(ExplainDiscover(err))
		}
		return &Node{Inventory: inv, DevRoot: node.DefaultDevRoot}, nil
	}
	sim, err := simnode.New(simulate, opts...)
	if err != nil {
		return nil, err
	}
	tree, err := os.MkdirTemp(dir, TempPattern(nodeTempPrefix))
	if err != nil {
		return nil, err
	}
	host, err := sim.MakeHost(filepath.Join(tree, "host"))
	if err != nil {
		os.RemoveAll(tree)
		return nil, simulatedErr(simulate, err)
	}
	inv, err := nvmlnode.Discover(ctx, sim.DiscoverOptions(host)...)
	if err != nil {
		os.RemoveAll(tree)
		return nil, err
	}
	return &Node{Inventory: inv, DevRoot: host.DevRoot, Where: " of simulated " + simulate, dir: tree}, nil
}

// OpenSharedNode is OpenNode with a simulated node kept at root for every
// later call to find (simnode's Node.OpenHost): its host tree (device
// nodes, /proc and /sys files) is made once, even by concurrent calls, and
// made again where a killed call left it half made; then reused. Close
// leaves it. root must be new, empty or such a tree: a directory holding
// anything else, or the host's own /, /dev, /proc or /sys, is refused
// before anything is written, and nothing gpuiso did not make is removed;
// so is a root that root does not own, or that others may write in (or
// whose parents are so: simnode.ErrUntrusted). The node shares the
// faults injected into the tree (simnode's Node.ShareFaults): a GPU that
// gpuinfo --inject made fall off the bus is lost for it too. opts
// configure the simulated node.
func OpenSharedNode(ctx context.Context, simulate, root string, opts ...simnode.Option) (*Node, error) {
	if simulate == "" {
		return OpenNode(ctx, "")
	}
	sim, err := simnode.New(simulate, opts...)
	if err != nil {
		return nil, err
	}
	host, err := sim.OpenHost(ctx, root)
	if err == nil {
		// Faults injected into the host (gpuinfo --inject) are seen by
		// every program simulating it.
		err = sim.ShareFaults(host)
	}
	if err != nil {
		return nil, simulatedErr(simulate, err)
	}
	inv, err := nvmlnode.Discover(ctx, sim.DiscoverOptions(host)...)
	if err != nil {
		return nil, err
	}
	return &Node{Inventory: inv, DevRoot: host.DevRoot, Where: " of simulated " + simulate}, nil
}

// simulatedErr says which simulated node's host tree could not be made,
// and that root is needed where the cause is a permission.
func simulatedErr(name string, err error) error {
	if errors.Is(err, fs.ErrPermission) {
		return fmt.Errorf("simulated node %s (needs root): %w", name, err)
	}
	return fmt.Errorf("simulated node %s: %w", name, err)
}

const nodeTempPrefix = "gpuiso-node"

// TempPattern is an os.MkdirTemp pattern for a temporary directory of this
// process: "<prefix>-<pid>.<start time>-*" (the process in node.Process's
// text form; linux.OwnedPattern), so that RemoveDeadTemp can tell when its
// maker has died.
func TempPattern(prefix string) string {
	p, _ := linux.Self("") // the zero Process where /proc cannot tell: no owner
	return linux.OwnedPattern(prefix+"-", p)
}

// RemoveDeadTemp removes the temporary directories (named by TempPattern
// with prefix, or the simulated nodes of OpenNode when prefix is "") whose
// maker has provably died, and returns them.
func RemoveDeadTemp(prefix string) ([]string, error) {
	return RemoveDeadTempIn(os.TempDir(), prefix)
}

// RemoveDeadTempIn is RemoveDeadTemp for the temporary directories under
// dir (os.TempDir() when dir is "").
func RemoveDeadTempIn(dir, prefix string) ([]string, error) {
	if prefix == "" {
		prefix = nodeTempPrefix
	}
	if dir == "" {
		dir = os.TempDir()
	}
	return linux.RemoveDeadOwned("", dir, prefix+"-")
}

// Close removes a simulated node's host tree.
func (n *Node) Close() error {
	if n.dir == "" {
		return nil
	}
	return os.RemoveAll(n.dir)
}

// DescribeGPUs writes GPUs as the programs report them: "GPUs 1,3 (GPU-...,GPU-...)".
func DescribeGPUs(gpus []node.DeviceRef) string {
	if len(gpus) == 0 {
		return "no GPUs"
	}
	var idx, uuids []string
	for _, g := range gpus {
		idx = append(idx, strconv.Itoa(g.Index))
		uuids = append(uuids, g.UUID)
	}
	return fmt.Sprintf("GPUs %s (%s)", strings.Join(idx, ","), strings.Join(uuids, ","))
}

// CheckMIG says whether inv has MIG devices of profile, so that a request
// for them fails with its real cause (no GPU in MIG mode, an unknown
// profile) rather than as a shortage. The error matches node.ErrNotSupported
// or node.ErrNotFound.
func CheckMIG(inv *node.Inventory, profile string) error {
	var have []string
	split := false
	for _, d := range inv.Devices {
		if !d.MIGSplit() {
			continue
		}
		split = true
		for _, m := range d.MIGDevices {
			if m.Profile == profile {
				return nil
			}
			if !slices.Contains(have, m.Profile) {
				have = append(have, m.Profile)
			}
		}
	}
	if !split {
		return fmt.Errorf("no GPU of this node has MIG enabled (--simulate hgx-h100-mig has some): %w", node.ErrNotSupported)
	}
	slices.Sort(have)
	return fmt.Errorf("no MIG device of profile %q on this node (it has %s): %w", profile, strings.Join(have, ", "), node.ErrNotFound)
}

// DescribeMIG writes MIG devices as the programs report them: "MIG device
// 1g.10gb (MIG-...) of GPU 0 (GPU-...)", or DescribeGPUs' words for whole
// GPUs. inv names the parents.
func DescribeMIG(inv *node.Inventory, gpus []node.DeviceRef) string {
	var parts []string
	for _, g := range gpus {
		found := false
		for _, d := range inv.Devices {
			for _, m := range d.MIGDevices {
				if m.UUID == g.UUID {
					parts = append(parts, fmt.Sprintf("MIG device %s (%s) of GPU %d (%s)", m.Profile, m.UUID, d.Index, d.UUID))
					found = true
				}
			}
		}
		if !found {
			return DescribeGPUs(gpus)
		}
	}
	if len(parts) == 0 {
		return DescribeGPUs(gpus)
	}
	return strings.Join(parts, ", ")
}
