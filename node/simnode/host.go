package simnode

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
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
// which needs root for the device nodes. It refuses any dir whose dev root
// would be the real /dev or inside it. On error nothing it created is left.
func (n *Node) MakeHost(dir string) (*Host, error) {
	root, err := resolveDir(dir)
	if err != nil {
		return nil, fmt.Errorf("make simulated host in %s: %w", dir, err)
	}
	h := &Host{Root: root, DevRoot: filepath.Join(root, "dev"), ProcRoot: filepath.Join(root, "proc"), SysRoot: filepath.Join(root, "sys")}
	for _, p := range []string{h.DevRoot, h.ProcRoot, h.SysRoot} {
		if _, err := os.Lstat(p); err == nil {
			return nil, fmt.Errorf("make simulated host in %s: %w", dir, &fs.PathError{Op: "create", Path: p, Err: fs.ErrExist})
		}
	}
	majors, err := freeMajors(node.DefaultProcRoot, 3)
	if err != nil {
		return nil, fmt.Errorf("make simulated host in %s: %w", dir, err)
	}
	h.NVIDIAMajor, h.UVMMajor, h.CapsMajor = majors[0], majors[1], majors[2]
	if err := n.populate(h); err != nil {
		h.Remove()
		return nil, fmt.Errorf("make simulated host in %s: %w", dir, err)
	}
	return h, nil
}

// Remove deletes the host tree (not Root itself).
func (h *Host) Remove() error {
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

func (n *Node) populate(h *Host) error {
	if err := os.MkdirAll(h.DevRoot, 0o755); err != nil {
		return err
	}
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
	for name, dev := range nodes {
		if err := linux.Mknod(filepath.Join(h.DevRoot, name), 0o666, dev); err != nil {
			return err
		}
	}
	if err := n.populateCaps(h); err != nil {
		return err
	}

	files := map[string]string{
		filepath.Join(h.ProcRoot, "devices"): fmt.Sprintf("Character devices:\n  1 mem\n  5 /dev/tty\n%3d nvidia\n%3d nvidia-uvm\n%3d nvidia-caps\n\nBlock devices:\n  8 sd\n",
			h.NVIDIAMajor, h.UVMMajor, h.CapsMajor),
		filepath.Join(h.ProcRoot, "driver", "nvidia", "version"): fmt.Sprintf(
			"NVRM version: NVIDIA UNIX x86_64 Kernel Module  %s  (simulated node %s)\n", n.driverVersion, n.spec.Name),
	}
	for i, g := range n.spec.GPUs {
		files[filepath.Join(h.ProcRoot, "driver", "nvidia", "gpus", g.BusID, "information")] = fmt.Sprintf(
			"Model: \t\t %s\nGPU UUID: \t %s\nBus Location: \t %s\nDevice Minor: \t %d\n", n.spec.GPU.Model, n.UUID(i), g.BusID, n.spec.minor(i))
		files[filepath.Join(h.SysRoot, "bus", "pci", "devices", g.BusID, "numa_node")] = fmt.Sprintf("%d\n", g.NUMANode)
	}
	for path, body := range files {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(path, []byte(body), 0o444); err != nil {
			return err
		}
	}
	return nil
}

// resolveDir makes dir absolute and resolves the symlinks of its longest
// existing prefix, so that the /dev check sees where files would really land,
// and only then creates what is missing.
func resolveDir(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	existing, rest := abs, ""
	for {
		if _, err := os.Lstat(existing); err == nil {
			break
		}
		parent := filepath.Dir(existing)
		if parent == existing {
			break
		}
		rest = filepath.Join(filepath.Base(existing), rest)
		existing = parent
	}
	real, err := filepath.EvalSymlinks(existing)
	if err != nil {
		return "", err
	}
	root := filepath.Join(real, rest)
	if inRealDev(root) || inRealDev(filepath.Join(root, "dev")) {
		return "", ErrRealDev
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return "", err
	}
	return root, nil
}

func inRealDev(p string) bool { return p == "/dev" || strings.HasPrefix(p, "/dev/") }

// freeMajors picks n character majors in the range Linux reserves for local
// use (240-254) that the host's /proc/devices does not list.
func freeMajors(procRoot string, n int) ([]uint32, error) {
	majors, err := node.ReadProcDevices(procRoot)
	if err != nil {
		return nil, fmt.Errorf("find free device majors: %w", err)
	}
	used := map[uint32]bool{}
	for _, m := range majors {
		used[m] = true
	}
	var out []uint32
	for m := uint32(240); m <= 254 && len(out) < n; m++ {
		if !used[m] {
			out = append(out, m)
		}
	}
	if len(out) < n {
		return nil, fmt.Errorf("find %d free device majors: 240-254 has %d", n, len(out))
	}
	return out, nil
}
