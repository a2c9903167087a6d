package simnode

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
)

// Host is the file-system side of a simulated node, under one directory:
// device nodes in DevRoot, the driver's /proc files in ProcRoot and the GPUs'
// sysfs attributes in SysRoot. Its nodes use NVIDIA's minors on majors that
// no driver of the real host owns, so opening one of its GPU nodes gives
// ENXIO where the device cgroup allows it (no driver answers) and EPERM where
// the cgroup denies it, even on a host whose real NVIDIA driver is loaded: an
// end-to-end check of isolation without a GPU. Its /proc/devices names those
// majors, so discovery reads them as a real node's.
type Host struct {
	Root     string
	DevRoot  string
	ProcRoot string
	SysRoot  string
	// NVIDIAMajor is the major number given to the GPU nodes and nvidiactl
	// (195 on a real node): one no driver of the real host uses.
	NVIDIAMajor uint32
	// UVMMajor is the major number given to nvidia-uvm and nvidia-uvm-tools:
	// another one no driver of the real host uses.
	UVMMajor uint32
	// CapsMajor is the major number of the MIG capability nodes
	// (/dev/nvidia-caps/nvidia-cap<M>, the nvidia-caps driver's): a third
	// one no driver of the real host uses.
	CapsMajor uint32
}

// MakeHost creates the node's host tree under dir (created if missing),
// which needs root for the device nodes. dir must be new, empty, or a tree
// MakeHost made whose dev, proc and sys are gone: a directory holding files
// gpuiso did not make is refused (a [*NotOwnedError], matching
// [ErrNotOwned]), a tree already there too (an [*ExistsError], matching
// [ErrTreeExists] and node.ErrExists; [Node.OpenHost] reuses one), and so
// is any dir that resolves to the host's own /, or lies in its /dev, /proc
// or /sys (a [*HostPathError]). dir and each of its parents must be owned
// by root (or the calling user) and writable by no one else (a sticky
// parent such as /tmp excepted), else an [*UntrustedError] matching
// [ErrUntrusted]: another user able to change the tree could point its GPUs
// at any device. The tree is made in-root (no link in it is followed out
// of it), marked as gpuiso's before anything is made in it and marked
// whole last. On error nothing it created is left.
func (n *Node) MakeHost(dir string) (*Host, error) {
	if n == nil || n.spec == nil {
		return nil, fmt.Errorf("make simulated host in %s: %w", dir, errNoNode)
	}
	root, made, err := hostDir(dir)
	if err == nil {
		err = trusted(root)
	}
	if err != nil {
		return nil, fmt.Errorf("make simulated host in %s: %w", dir, err)
	}
	h, err := n.makeHost(root, made)
	if err != nil {
		return nil, fmt.Errorf("make simulated host in %s: %w", dir, err)
	}
	return h, nil
}

// makeHost makes the tree in root, which hostDir and trusted checked;
// made is the first directory hostDir found missing on the way to root
// ("" when root existed), removed again on error.
func (n *Node) makeHost(root, made string) (*Host, error) {
	if err := claimable(root); err != nil {
		return nil, err
	}
	h := hostAt(root)
	for _, p := range []string{h.DevRoot, h.ProcRoot, h.SysRoot} {
		if _, err := os.Lstat(p); err == nil {
			return nil, &ExistsError{Dir: root, Path: p}
		}
	}
	majors, err := freeMajors(node.DefaultProcRoot, 3)
	if err != nil {
		return nil, err
	}
	h.NVIDIAMajor, h.UVMMajor, h.CapsMajor = majors[0], majors[1], majors[2]
	if err := os.MkdirAll(root, 0o755); err != nil {
		removeEmpty(root, made)
		return nil, err
	}
	r, err := openTrusted(root)
	if err != nil {
		removeEmpty(root, made)
		return nil, err
	}
	defer r.Close()
	if err := n.makeIn(r, h); err != nil {
		removeEmpty(root, made)
		return nil, err
	}
	return h, nil
}

// makeIn makes the tree h describes in r, its root opened in-root; on
// error it removes what it made (the marker only if it wrote it).
func (n *Node) makeIn(r *os.Root, h *Host) (err error) {
	wrote, err := mark(r)
	defer func() {
		if err == nil {
			return
		}
		for _, d := range []string{"dev", "proc", "sys"} {
			r.RemoveAll(d) // absent before, so made here
		}
		if wrote {
			r.Remove(markerName)
		}
	}()
	if err != nil {
		return err
	}
	if err := r.Remove(completeName); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := n.populate(r, h); err != nil {
		return err
	}
	return r.WriteFile(completeName, nil, 0o644)
}

// hostAt is the host tree at root, its numbers not yet known.
func hostAt(root string) *Host {
	return &Host{Root: root, DevRoot: filepath.Join(root, "dev"), ProcRoot: filepath.Join(root, "proc"), SysRoot: filepath.Join(root, "sys")}
}

// Remove deletes what MakeHost or OpenHost made in Root: its dev, proc and
// sys, the makers' lock and its marks (Root itself stays). A Root that is not a simulated host tree
// gpuiso made is refused and left as it is (a [*NotOwnedError], or a
// [*HostPathError] for the host's own directories).
func (h *Host) Remove() error {
	if h == nil {
		return fmt.Errorf("remove simulated host: no host: %w", node.ErrInvalid)
	}
	root, err := checkHostPath(h.Root)
	if err != nil {
		return fmt.Errorf("remove simulated host %s: %w", h.Root, err)
	}
	if !marked(root) {
		if names, err := entries(root); errors.Is(err, fs.ErrNotExist) || (err == nil && len(names) == 0) {
			return nil // nothing there
		} else if err == nil && slices.Equal(names, []string{makeLockDir}) && ownMakeLock(root) {
			// Only the makers' lock, left by a wait that ended.
			if err := removeMakeLock(root); err != nil {
				return fmt.Errorf("remove simulated host %s: %w", h.Root, err)
			}
			return nil
		}
		return fmt.Errorf("remove simulated host %s: %w", h.Root, owned(root))
	}
	// Unmarked whole first, unmarked as gpuiso's last: a removal cut
	// short leaves a tree that is still known to be gpuiso's.
	if err := os.Remove(filepath.Join(root, completeName)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove simulated host %s: %w", h.Root, err)
	}
	if err := errors.Join(removeTree(root), removeMakeLock(root)); err != nil {
		return fmt.Errorf("remove simulated host %s: %w", h.Root, err)
	}
	if err := os.Remove(filepath.Join(root, markerName)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove simulated host %s: %w", h.Root, err)
	}
	return nil
}

// removeTree removes the dev, proc and sys of a tree known to be gpuiso's.
func removeTree(root string) error {
	h := hostAt(root)
	return errors.Join(os.RemoveAll(h.DevRoot), os.RemoveAll(h.ProcRoot), os.RemoveAll(h.SysRoot))
}

// DiscoverOptions are the options that make nvmlnode.Discover read this
// simulated node and host instead of the real ones.
func (n *Node) DiscoverOptions(h *Host) []nvmlnode.Option {
	opts := []nvmlnode.Option{nvmlnode.WithNVML(n.NVML())}
	if h != nil {
		opts = append(opts, nvmlnode.WithDevRoot(h.DevRoot), nvmlnode.WithProcRoot(h.ProcRoot), nvmlnode.WithSysRoot(h.SysRoot))
	}
	return opts
}

// populate makes h's device nodes, /proc and /sys files in r.
func (n *Node) populate(r *os.Root, h *Host) error {
	char := func(major, minor uint32) linux.DeviceNumber {
		return linux.DeviceNumber{Char: true, Major: major, Minor: minor}
	}
	nodes := map[string]linux.DeviceNumber{
		node.NVIDIACtl:      char(h.NVIDIAMajor, nvmlnode.CtlMinor),
		node.NVIDIAUVM:      char(h.UVMMajor, 0),
		node.NVIDIAUVMTools: char(h.UVMMajor, 1),
	}
	for i := range n.spec.GPUs {
		nodes[fmt.Sprintf("nvidia%d", n.spec.minor(i))] = char(h.NVIDIAMajor, uint32(n.spec.minor(i)))
	}
	if err := mknodIn(r, "dev", nodes, nil); err != nil {
		return err
	}
	if err := n.populateCaps(r, h); err != nil {
		return err
	}

	files := map[string]string{
		"proc/devices": fmt.Sprintf("Character devices:\n  1 mem\n  5 /dev/tty\n%3d nvidia\n%3d nvidia-uvm\n%3d nvidia-caps\n\nBlock devices:\n  8 sd\n",
			h.NVIDIAMajor, h.UVMMajor, h.CapsMajor),
		"proc/driver/nvidia/version": fmt.Sprintf(
			"NVRM version: NVIDIA UNIX x86_64 Kernel Module  %s  (simulated node %s)\n", n.driverVersion, n.spec.Name),
	}
	for i, g := range n.spec.GPUs {
		files[path.Join("proc/driver/nvidia/gpus", g.BusID, "information")] = fmt.Sprintf(
			"Model: \t\t %s\nGPU UUID: \t %s\nBus Location: \t %s\nDevice Minor: \t %d\n", n.spec.GPU.Model, n.UUID(i), g.BusID, n.spec.minor(i))
		files[path.Join("sys/bus/pci/devices", g.BusID, "numa_node")] = fmt.Sprintf("%d\n", g.NUMANode)
	}
	maps.Copy(files, n.numaFiles(hostCPUs(), hostMemoryNodes()))
	return writeIn(r, files)
}

// numaFiles are the sysfs files of the simulated node's NUMA nodes (those
// its GPUs hang off): each node's cpulist, a part of cpus, the host's CPUs
// split in as many contiguous runs as there are nodes (a host with fewer
// CPUs gives a node several's); and has_memory, the host's memory nodes
// among them. A container pinned to a GPU's NUMA node then runs on CPUs the
// host has, and pinned to memory it has.
func (n *Node) numaFiles(cpus, memory []int) map[string]string {
	var nodes []int
	for _, g := range n.spec.GPUs {
		if g.NUMANode >= 0 && !slices.Contains(nodes, g.NUMANode) {
			nodes = append(nodes, g.NUMANode)
		}
	}
	slices.Sort(nodes)
	files := map[string]string{}
	if len(nodes) == 0 || len(cpus) == 0 {
		return files
	}
	var withMemory []string
	for i, nd := range nodes {
		var list []int
		if len(cpus) < len(nodes) {
			list = []int{cpus[i%len(cpus)]}
		} else {
			list = cpus[i*len(cpus)/len(nodes) : (i+1)*len(cpus)/len(nodes)]
		}
		files[fmt.Sprintf("sys/devices/system/node/node%d/cpulist", nd)] = formatList(list) + "\n"
		if slices.Contains(memory, nd) {
			withMemory = append(withMemory, strconv.Itoa(nd))
		}
	}
	files["sys/devices/system/node/has_memory"] = strings.Join(withMemory, ",") + "\n"
	return files
}

// mknodIn makes the device nodes of dir (made if missing) in r, each with
// mode 0666 unless modes names another.
func mknodIn(r *os.Root, dir string, nodes map[string]linux.DeviceNumber, modes map[string]os.FileMode) error {
	if err := r.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	d, err := r.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	for name, dev := range nodes {
		mode, ok := modes[name]
		if !ok {
			mode = 0o666
		}
		if err := linux.MknodAt(d, name, mode, dev); err != nil {
			return fmt.Errorf("%s: %w", filepath.Join(r.Name(), dir), err)
		}
	}
	return nil
}

// writeIn writes the files (slash-separated names in r) read-only, their
// directories made as needed.
func writeIn(r *os.Root, files map[string]string) error {
	for name, body := range files {
		if err := r.MkdirAll(path.Dir(name), 0o755); err != nil {
			return err
		}
		if err := r.WriteFile(name, []byte(body), 0o444); err != nil {
			return err
		}
	}
	return nil
}

// freeMajors picks n character majors that the host's /proc/devices does
// not list, from the ranges Linux reserves for local and experimental use
// (Documentation/admin-guide/devices.txt): 60-63 and 120-127 first, which
// the kernel never hands out to a driver that asks for a dynamic major,
// then 240-254, where dynamic majors are taken from the top down (a node
// with NVIDIA's, InfiniBand's and NVSwitch's drivers can fill all of it).
func freeMajors(procRoot string, n int) ([]uint32, error) {
	used, err := charMajors(filepath.Join(procRoot, "devices"))
	if err != nil {
		return nil, fmt.Errorf("find free device majors: %w", err)
	}
	var out []uint32
	for _, r := range localMajors {
		for m := r[0]; m <= r[1] && len(out) < n; m++ {
			if !used[m] {
				out = append(out, m)
			}
		}
	}
	if len(out) < n {
		return nil, fmt.Errorf("find %d free character device majors: %s has %d: %w", n, describeRanges(localMajors), len(out), node.ErrInsufficient)
	}
	return out, nil
}

// localMajors are the character major ranges reserved for local use, in
// the order freeMajors takes them.
var localMajors = [][2]uint32{{60, 63}, {120, 127}, {240, 254}}

func describeRanges(rs [][2]uint32) string {
	var parts []string
	for _, r := range rs {
		parts = append(parts, fmt.Sprintf("%d-%d", r[0], r[1]))
	}
	return strings.Join(parts, ", ")
}

// charMajors reads every character-device major that a /proc/devices file
// lists, whatever the name: one driver may register several majors under
// one name (infiniband_mad), and several names may share one major.
func charMajors(path string) (map[uint32]bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	devs, err := node.ParseCharacterDevices(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	used := map[uint32]bool{}
	for _, d := range devs {
		used[d.Major] = true
	}
	return used, nil
}
