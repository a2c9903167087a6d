package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/isolator/mps"
	"github.com/gpuiso/gpuiso/node"
)

// shareFlags are the flags of shared GPUs: which GPUs are handed out in
// parts (memory shares through DRA, time slices through the device
// plugin) and how.
type shareFlags struct {
	sharedGPUs     string
	shareMin       string
	shareStep      string
	timeSlices     int
	sharedResource string
	podResources   string
	mpsControl     string
}

func (s *shareFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&s.sharedGPUs, "shared-gpus", "", "the GPUs handed out in parts instead of whole: `LIST` of indexes or UUIDs, comma-separated, or \"all\" (the DRA driver publishes each as memory shares enforced by an MPS daemon; the device plugin serves each as --time-slices replicas)")
	fs.StringVar(&s.shareMin, "share-min", "1Gi", "DRA: the least memory of a share, what a claim asking for none gets (`SIZE`, a quantity: 1Gi)")
	fs.StringVar(&s.shareStep, "share-step", "256Mi", "DRA: the steps of a share's memory above --share-min (`SIZE`, a quantity: 256Mi)")
	fs.IntVar(&s.timeSlices, "time-slices", allocator.DefaultTimeSlices, "device plugin: the time slices (replicas) of each shared GPU, `N`")
	fs.StringVar(&s.sharedResource, "shared-resource-name", "nvidia.com/gpu.shared", "device plugin: the resource of the time slices")
	fs.StringVar(&s.podResources, "pod-resources-socket", "/var/lib/kubelet/pod-resources/kubelet.sock", "the kubelet's pod-resources socket, which tells the GPUs and time slices pods of the device plugin still hold (those of an earlier device plugin too, with it off)")
	fs.StringVar(&s.mpsControl, "mps-control", "", "DRA: the MPS control daemon's binary (default: nvidia-cuda-mps-control in PATH, else under --driver-root)")
}

// check validates the share flags; it returns the reason a command line is
// refused, or "".
func (s *shareFlags) check() string {
	if s.sharedGPUs == "" {
		return ""
	}
	for _, v := range []struct{ name, val string }{{"--share-min", s.shareMin}, {"--share-step", s.shareStep}} {
		if _, err := quantity(v.val); err != nil {
			return v.name + ": " + err.Error()
		}
	}
	if s.timeSlices < 1 {
		return "--time-slices must be 1 or more"
	}
	if s.mpsControl != "" && !filepath.IsAbs(s.mpsControl) {
		return "--mps-control must be an absolute path"
	}
	return ""
}

// sizes are --share-min and --share-step, checked by check.
func (s *shareFlags) sizes() (least, step uint64) {
	least, _ = quantity(s.shareMin)
	step, _ = quantity(s.shareStep)
	return least, step
}

// quantity reads a size as Kubernetes writes quantities (8Gi, 512Mi,
// 1G): a whole number of bytes above 0.
func quantity(v string) (uint64, error) {
	q, err := resource.ParseQuantity(v)
	if err != nil {
		return 0, fmt.Errorf("size %q: %w", v, err)
	}
	n, ok := q.AsInt64()
	if !ok || n <= 0 {
		return 0, fmt.Errorf("size %q: want a whole number of bytes above 0 (1Gi, 256Mi)", v)
	}
	return uint64(n), nil
}

// errSharedGPU: --shared-gpus names a GPU the node does not have, or one
// split by MIG.
var errSharedGPU = node.Sentinel(node.ErrInvalid, "--shared-gpus")

// sharedUUIDs resolves list ("all", or indexes and UUIDs) against the
// node's whole GPUs: the UUIDs, in inventory order. "all" skips GPUs
// split by MIG; naming one is an error.
func sharedUUIDs(inv *node.Inventory, list string) ([]string, error) {
	list = strings.TrimSpace(list)
	if list == "" {
		return nil, nil
	}
	want := map[int]bool{}
	if list == "all" {
		for p, d := range inv.Devices {
			if !d.MIGSplit() && d.UUID != "" {
				want[p] = true
			}
		}
	} else {
		for _, item := range strings.Split(list, ",") {
			item = strings.TrimSpace(item)
			p := -1
			for i, d := range inv.Devices {
				if n, err := strconv.Atoi(item); err == nil && d.Index == n || d.UUID != "" && strings.EqualFold(d.UUID, item) {
					p = i
				}
			}
			switch {
			case p < 0:
				return nil, fmt.Errorf("GPU %q: not on this node: %w", item, errSharedGPU)
			case inv.Devices[p].MIGSplit():
				return nil, fmt.Errorf("GPU %q: MIG is enabled, its MIG devices are handed out instead: %w", item, errSharedGPU)
			case inv.Devices[p].UUID == "":
				return nil, fmt.Errorf("GPU %q: no UUID: %w", item, errSharedGPU)
			}
			want[p] = true
		}
	}
	var out []string
	for p, d := range inv.Devices {
		if want[p] {
			out = append(out, d.UUID)
		}
	}
	return out, nil
}

// mpsManager is the manager of the DRA shares' MPS daemons, under the
// state directory.
func (f *flags) mpsManager() (*mps.Manager, error) {
	var opts []mps.Option
	if f.share.mpsControl != "" {
		opts = append(opts, mps.WithControl(f.share.mpsControl))
	} else if f.deploy.driverRoot != "" {
		opts = append(opts, mps.WithDriverRoot(f.deploy.driverRoot))
	}
	// The plugin runs in a pod whose mounts do not reach the node's
	// containerd, so a share's directories stay plain directories there
	// (see mps.WithPlainDirs).
	opts = append(opts, mps.WithPlainDirs())
	m, err := mps.New(filepath.Join(f.stateDir, "mps"), opts...)
	if err != nil {
		return nil, fmt.Errorf("memory shares of --shared-gpus: %w", err)
	}
	return m, nil
}

// cleanShares removes the MPS daemons' directory once no claim is
// prepared (cleanNode checked): any daemon left in it is stopped first.
func (f *flags) cleanShares(ctx context.Context) error {
	dir := filepath.Join(f.stateDir, "mps")
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if ds, _ := mps.Daemons(ctx, dir); len(ds) > 0 {
		m, err := f.mpsManager()
		if err != nil {
			return err
		}
		defer m.Close()
		if _, err := m.Sweep(ctx, nil); err != nil {
			return err
		}
	}
	return os.RemoveAll(dir)
}
