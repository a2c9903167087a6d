package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/isolator/mps"
	"github.com/gpuiso/gpuiso/kubernetes/deviceplugin"
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
	mpsDriverRoot  string
	mpsCgroup      string
	mpsCgroupRoot  string
	mpsPlainDirs   bool
	mpsShmSize     string
	mpsMountNS     string
	mpsHostDriver  string
	dpSharing      string
}

// dpStrategy is --device-plugin-sharing, checked by check.
func (s *shareFlags) dpStrategy() deviceplugin.Strategy {
	st, _ := deviceplugin.ParseStrategy(s.dpSharing)
	return st
}

func (s *shareFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&s.sharedGPUs, "shared-gpus", "", "the GPUs handed out in parts instead of whole: `LIST` of indexes or UUIDs, comma-separated, or \"all\" (the DRA driver publishes each as a share device whose claims are memory shares enforced by an MPS daemon, time slices or concurrent slices under one MPS daemon per GPU; the device plugin serves each as --time-slices replicas)")
	fs.StringVar(&s.shareMin, "share-min", "1Gi", "DRA: the least memory of a share, what a claim asking for none gets (`SIZE`, a quantity: 1Gi)")
	fs.StringVar(&s.shareStep, "share-step", "256Mi", "DRA: the steps of a share's memory above --share-min (`SIZE`, a quantity: 256Mi)")
	fs.IntVar(&s.timeSlices, "time-slices", allocator.DefaultTimeSlices, "the time slices of each shared GPU, `N`: the device plugin's replicas, and the most DRA time slices a GPU takes")
	fs.StringVar(&s.dpSharing, "device-plugin-sharing", string(deviceplugin.StrategyTimeSlicing), "device plugin: how the --time-slices replicas of a shared GPU share it: \"time-slicing\" (time slices: nothing enforced but their number) or \"mps\" (concurrent slices: one MPS daemon per GPU, started with its first replica and stopped with its last, holds each replica's processes to 1/N of the GPU's memory and threads; N from 2 to 48; a container may ask for one replica only; the --mps-* flags place the daemons)")
	fs.StringVar(&s.sharedResource, "shared-resource-name", "nvidia.com/gpu.shared", "device plugin: the resource of the time slices")
	fs.StringVar(&s.podResources, "pod-resources-socket", "/var/lib/kubelet/pod-resources/kubelet.sock", "the kubelet's pod-resources socket, which tells the GPUs and time slices pods of the device plugin still hold (those of an earlier device plugin too, with it off)")
	fs.StringVar(&s.mpsControl, "mps-control", "", "MPS daemons: the MPS control daemon's binary (default: nvidia-cuda-mps-control in PATH, else under --mps-driver-root)")
	fs.StringVar(&s.mpsDriverRoot, "mps-driver-root", "", "MPS daemons: the driver root the MPS control daemon's binary is looked for under (default: --driver-root); a simulated node's may be a real one")
	fs.StringVar(&s.mpsCgroup, "mps-cgroup-parent", "", "MPS daemons: the cgroup (`PATH` as the host names it) under which each MPS daemon gets a cgroup of its own, gpuiso-mps/<owner>, outside the plugin's: \"auto\" is the parent of the kubepods cgroup the plugin's pod is in, a sibling of every pod's; \"\" leaves the daemons in the plugin's cgroup")
	fs.StringVar(&s.mpsCgroupRoot, "mps-cgroup-root", mps.DefaultCgroupRoot, "MPS daemons: where the host's cgroup hierarchies are mounted (in a pod: the host's /sys/fs/cgroup mounted elsewhere)")
	fs.BoolVar(&s.mpsPlainDirs, "mps-plain-dirs", false, "MPS daemons: keep each share's /dev/shm and MPS pipe directory plain directories of --state-dir instead of bounded tmpfs mounts: only for a plugin whose mounts do not reach the container runtime (a pod without bidirectional mount propagation on --state-dir); nothing then bounds what a share writes there but the disk")
	fs.StringVar(&s.mpsMountNS, "mps-mount-namespace", "", "MPS daemons: the mount namespace each MPS daemon's own is made from: \"\" is the plugin's, \"runtime\" that of the container runtime that started the plugin (its parent process, with hostPID: the node's), which a pod's removal leaves in place, or a `PATH` (/proc/<pid>/ns/mnt); --state-dir must be at the same path there")
	fs.StringVar(&s.mpsHostDriver, "mps-namespace-driver-root", "", "MPS daemons: with --mps-mount-namespace, where that namespace has the driver root the MPS binary was found under (the node's --driver-root, where the pod has it at /driver-root)")
	fs.StringVar(&s.mpsShmSize, "mps-shm-size", "64Mi", "MPS daemons: the size of each share's /dev/shm, a tmpfs of its own (`SIZE`, a quantity: 64Mi); a write past it fails with ENOSPC")
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
	if _, err := deviceplugin.ParseStrategy(s.dpSharing); err != nil {
		return "--device-plugin-sharing: " + err.Error()
	}
	if s.dpStrategy() == deviceplugin.StrategyMPS && (s.timeSlices < allocator.MinSlices || s.timeSlices > allocator.MaxSlices) {
		return fmt.Sprintf("--device-plugin-sharing=mps: --time-slices %d, want %d to %d concurrent slices per GPU", s.timeSlices, allocator.MinSlices, allocator.MaxSlices)
	}
	if s.mpsControl != "" && !filepath.IsAbs(s.mpsControl) {
		return "--mps-control must be an absolute path"
	}
	if s.mpsDriverRoot != "" && !filepath.IsAbs(s.mpsDriverRoot) {
		return "--mps-driver-root must be an absolute path"
	}
	if s.mpsCgroup != "" && s.mpsCgroup != "auto" {
		if err := mps.CheckCgroupParent(s.mpsCgroup); err != nil {
			return "--mps-cgroup-parent: " + err.Error()
		}
	}
	if !filepath.IsAbs(s.mpsCgroupRoot) {
		return "--mps-cgroup-root must be an absolute path"
	}
	if s.mpsMountNS != "" && s.mpsMountNS != "runtime" && !filepath.IsAbs(s.mpsMountNS) {
		return "--mps-mount-namespace must be \"runtime\" or an absolute path"
	}
	if s.mpsHostDriver != "" && !filepath.IsAbs(s.mpsHostDriver) {
		return "--mps-namespace-driver-root must be an absolute path"
	}
	if _, err := quantity(s.mpsShmSize); err != nil {
		return "--mps-shm-size: " + err.Error()
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
	return f.mpsManagerAt(filepath.Join(f.stateDir, mpsDir))
}

// The MPS daemons' directories under the state directory: the DRA
// driver's (one per memory share, one per GPU of its concurrent slices)
// and the device plugin's (one per GPU of its concurrent slices,
// --device-plugin-sharing=mps). Each program part sweeps its own by what
// it holds.
const (
	mpsDir             = "mps"
	deviceSlicesMPSDir = "mps-deviceplugin"
)

// deviceSlicesMPS is the manager of the device plugin's concurrent
// slices' MPS daemons (--device-plugin-sharing=mps), under the state
// directory; nil, nil for time slices or without shared GPUs.
func (f *flags) deviceSlicesMPS(shared []string) (*mps.Manager, error) {
	if len(shared) == 0 || f.share.dpStrategy() != deviceplugin.StrategyMPS {
		return nil, nil
	}
	return f.mpsManagerAt(filepath.Join(f.stateDir, deviceSlicesMPSDir))
}

// mpsManagerAt is the manager of the MPS daemons of dir, with the --mps-*
// flags.
func (f *flags) mpsManagerAt(dir string) (*mps.Manager, error) {
	var opts []mps.Option
	switch {
	case f.share.mpsControl != "":
		opts = append(opts, mps.WithControl(f.share.mpsControl))
	case f.share.mpsDriverRoot != "":
		opts = append(opts, mps.WithDriverRoot(f.share.mpsDriverRoot))
	case f.deploy.driverRoot != "":
		opts = append(opts, mps.WithDriverRoot(f.deploy.driverRoot))
	}
	if f.share.mpsPlainDirs {
		opts = append(opts, mps.WithPlainDirs())
	} else {
		shm, _ := quantity(f.share.mpsShmSize)
		opts = append(opts, mps.WithShmSize(shm))
	}
	place, err := f.share.cgroupPlacement()
	if err != nil {
		return nil, fmt.Errorf("memory shares of --shared-gpus: %w", err)
	}
	if ns := f.share.mpsMountNS; ns != "" {
		if ns == "runtime" {
			// The container runtime's process that started the plugin
			// (a shim), seen through the host's pid namespace.
			ppid := os.Getppid()
			if ppid <= 1 {
				return nil, fmt.Errorf("--mps-mount-namespace=runtime: the plugin's parent is pid %d, not its container runtime's (a pod without hostPID?): %w", ppid, errMountNamespace)
			}
			ns = fmt.Sprintf("/proc/%d/ns/mnt", ppid)
		}
		opts = append(opts, mps.WithMountNamespace(ns, f.share.mpsHostDriver))
	}
	m, err := mps.New(dir, append(opts, place...)...)
	if err != nil {
		return nil, fmt.Errorf("memory shares of --shared-gpus: %w", err)
	}
	return m, nil
}

// cleanShares removes the MPS daemons' directories (the DRA driver's and
// the device plugin's) once no claim is prepared (cleanNode checked): any
// daemon left in them is stopped first.
func (f *flags) cleanShares(ctx context.Context) error {
	var errs []error
	for _, name := range []string{mpsDir, deviceSlicesMPSDir} {
		errs = append(errs, f.cleanDaemons(ctx, filepath.Join(f.stateDir, name)))
	}
	return errors.Join(errs...)
}

// cleanDaemons stops the daemons of the MPS directory dir and removes it.
func (f *flags) cleanDaemons(ctx context.Context, dir string) error {
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if ds, _ := mps.Daemons(ctx, dir); len(ds) > 0 {
		m, err := f.mpsManagerAt(dir)
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

// errCgroupParent: --mps-cgroup-parent=auto found no kubepods cgroup.
var errCgroupParent = node.Sentinel(node.ErrNotFound, "--mps-cgroup-parent")

// errMountNamespace: --mps-mount-namespace=runtime found no runtime.
var errMountNamespace = node.Sentinel(node.ErrNotFound, "--mps-mount-namespace")

// hostCgroupNamespace is the host's cgroup namespace as a plugin that
// shares the host's pid namespace (hostPID) sees it.
const hostCgroupNamespace = "/proc/1/ns/cgroup"

// cgroupPlacement are the options that place the shares' daemons in
// cgroups outside the plugin's (--mps-cgroup-parent): none without it.
// With "auto" the parent is that of the first kubepods cgroup in the
// plugin's own cgroup path, as the host names it: read in the plugin's own
// cgroup namespace, or, where that shows no kubepods (a pod's namespace of
// its own, rooted at its container's cgroup), in the host's, which the
// daemons are then moved from too.
func (s *shareFlags) cgroupPlacement() ([]mps.Option, error) {
	if s.mpsCgroup == "" {
		return nil, nil
	}
	opts := []mps.Option{mps.WithCgroupRoot(s.mpsCgroupRoot)}
	parent := s.mpsCgroup
	if parent == "auto" {
		own, err := mps.OwnCgroups("")
		if err != nil {
			return nil, fmt.Errorf("--mps-cgroup-parent=auto: %w", err)
		}
		var ok bool
		if parent, ok = kubepodsParent(own); !ok {
			if own, err = mps.OwnCgroups(hostCgroupNamespace); err != nil {
				return nil, fmt.Errorf("--mps-cgroup-parent=auto: in the host's cgroup namespace: %w", err)
			}
			if parent, ok = kubepodsParent(own); !ok {
				return nil, fmt.Errorf("--mps-cgroup-parent=auto: no kubepods cgroup in the plugin's cgroups %v: name the parent: %w", own, errCgroupParent)
			}
			opts = append(opts, mps.WithCgroupNamespace(hostCgroupNamespace))
		}
	}
	return append(opts, mps.WithCgroup(parent)), nil
}

// kubepodsParent is the parent of the first kubepods cgroup (kubepods
// with the cgroupfs driver, kubepods.slice with systemd's) in a process's
// cgroups (mps.OwnCgroups): the unified hierarchy's path first, else
// the memory hierarchy's, else any other's.
func kubepodsParent(cgroups map[string]string) (string, bool) {
	keys := []string{"", "memory"}
	keys = append(keys, slices.Sorted(maps.Keys(cgroups))...)
	for _, k := range keys {
		p, ok := cgroups[k]
		if !ok {
			continue
		}
		parts := strings.Split(strings.TrimPrefix(p, "/"), "/")
		for i, c := range parts {
			if c == "kubepods" || strings.HasPrefix(c, "kubepods.") || strings.HasPrefix(c, "kubepods-") {
				return "/" + strings.Join(parts[:i], "/"), true
			}
		}
	}
	return "", false
}
