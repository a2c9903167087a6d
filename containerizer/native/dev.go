package native

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/node"
)

type pseudoDevice struct {
	name         string
	major, minor uint32
}

// pseudoDevices are the nodes every container's /dev holds (the runtime's
// default allow list lets them through).
func pseudoDevices() []pseudoDevice {
	return []pseudoDevice{{"null", 1, 3}, {"zero", 1, 5}, {"full", 1, 7}, {"random", 1, 8}, {"urandom", 1, 9}, {"tty", 5, 0}}
}

// makeDev mounts a tmpfs at dir and fills it as the container's /dev: the
// default pseudo devices, /proc/self/fd links, mount points for pts and shm,
// and nodes (the control devices and the container's GPUs) bind-mounted from
// the host's dev root. The tmpfs is a shared mount: the container's /dev is
// a slave of it, so nodes bound or unbound here later (a live update) appear
// and disappear there too.
func makeDev(dir string, nodes []isolator.DeviceNode) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := linux.MountDevTmpfs(dir); err != nil {
		return err
	}
	if err := linux.MakeShared(dir); err != nil {
		return err
	}
	for _, d := range pseudoDevices() {
		if err := linux.Mknod(filepath.Join(dir, d.name), 0o666, linux.DeviceNumber{Char: true, Major: d.major, Minor: d.minor}); err != nil {
			return err
		}
	}
	for _, sub := range []string{"pts", "shm"} {
		if err := os.Mkdir(filepath.Join(dir, sub), 0o755); err != nil {
			return err
		}
	}
	links := map[string]string{
		"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2",
		"ptmx": "pts/ptmx", "core": "/proc/kcore",
	}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
			return err
		}
	}
	for _, n := range nodes {
		if err := addNode(dir, n); err != nil {
			return err
		}
	}
	return nil
}

// addNode binds the host's node n.HostPath into a container's /dev (dir)
// under its own name, after checking that it is the character device the
// plan says. The container's root writes its /dev while it runs (a live
// update adds nodes then): the node's directory (nvidia-caps) and the node
// are found and made inside dir, a link there never followed out of it.
func addNode(dir string, n isolator.DeviceNode) error {
	rel, err := nodePath(n)
	if err != nil {
		return err
	}
	root, err := linux.OpenRoot(dir)
	if err != nil {
		return fmt.Errorf("device node %s: %w", n.Path, err)
	}
	defer root.Close()
	if have, err := root.StatDevice(rel); err == nil && have.Char && have.Major == n.Major && have.Minor == n.Minor {
		return nil // already there
	}
	host, err := linux.StatDevice(n.HostPath)
	if err != nil {
		return fmt.Errorf("device node %s: %w", n.Path, err)
	}
	if !host.Char || host.Major != n.Major || host.Minor != n.Minor {
		return fmt.Errorf("device node %s: %s is %d:%d, want %d:%d", n.Path, n.HostPath, host.Major, host.Minor, n.Major, n.Minor)
	}
	if err := root.Bind(n.HostPath, rel, false); err != nil {
		root.Unbind(rel)
		return fmt.Errorf("device node %s: %w", n.Path, err)
	}
	return nil
}

// removeNode unbinds a node from a container's /dev (dir) and deletes its
// mount point, both inside dir (see addNode).
func removeNode(dir string, n isolator.DeviceNode) error {
	rel, err := nodePath(n)
	if err != nil {
		return err
	}
	root, err := linux.OpenRoot(dir)
	if err != nil {
		return fmt.Errorf("device node %s: %w", n.Path, err)
	}
	defer root.Close()
	if err := root.Unbind(rel); err != nil {
		return fmt.Errorf("device node %s: %w", n.Path, err)
	}
	return nil
}

// nodePath is where n appears under a container's /dev directory: its
// path below the container's /dev (nvidia0, nvidia-caps/nvidia-cap12).
func nodePath(n isolator.DeviceNode) (string, error) {
	rel, err := filepath.Rel(isolator.ContainerDevRoot, n.Path)
	if err != nil || rel == "." || strings.HasPrefix(rel, "..") {
		return "", fmt.Errorf("device node %s: not under %s: %w", n.Path, isolator.ContainerDevRoot, node.ErrInvalid)
	}
	return rel, nil
}

// removeDev unmounts a container's /dev and removes its directory.
func removeDev(dir string) error {
	// EINVAL: not mounted (any more); ENOENT: never made.
	if err := linux.DetachUnmount(dir); err != nil && !errors.Is(err, fs.ErrNotExist) && !linux.Invalid(err) {
		return err
	}
	return os.RemoveAll(dir)
}

// driverParams is the NVIDIA driver's module parameters below a /proc.
const driverParams = "driver/nvidia/params"

// driverParamsCopy is the name, in a container's directory, of the copy of
// the driver's parameters its /proc shows.
const driverParamsCopy = "nvidia-params"

// keepDeviceNodes keeps the NVIDIA driver's libraries from making device
// nodes in a container's /dev. Run as root, libcuda, libnvidia-ml and
// nvidia-modprobe create the node of every GPU the driver knows (and of
// nvidiactl and nvidia-uvm) that is missing from /dev, unless the driver's
// parameters in /proc say ModifyDeviceFiles: 0; the container's own device
// cgroup denies opening such a node, but its /dev would then hold GPUs it
// was not given. So over procDir's driver parameters (procDir: where the
// container's /proc is mounted) goes a read-only copy, written to scratch,
// that says ModifyDeviceFiles: 0. Without a loaded NVIDIA driver there is
// nothing to cover.
func keepDeviceNodes(procDir, scratch string) error {
	target := filepath.Join(procDir, driverParams)
	b, err := os.ReadFile(target)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("driver parameters: %w", err)
	}
	out, changed := noDeviceFileChanges(b)
	if !changed {
		return nil
	}
	if err := os.WriteFile(scratch, out, 0o444); err != nil {
		return fmt.Errorf("driver parameters: %w", err)
	}
	if err := linux.BindMount(scratch, target, true); err != nil {
		return fmt.Errorf("driver parameters: %w", err)
	}
	return nil
}

// noDeviceFileChanges is the driver's parameters (/proc/driver/nvidia/params:
// "Name: value" lines) with ModifyDeviceFiles set to 0, and whether that
// changed them.
func noDeviceFileChanges(params []byte) ([]byte, bool) {
	lines := bytes.Split(params, []byte("\n"))
	changed := false
	for i, l := range lines {
		name, value, ok := bytes.Cut(l, []byte(":"))
		name = bytes.TrimPrefix(bytes.TrimSpace(name), []byte("NVreg_"))
		if !ok || string(name) != "ModifyDeviceFiles" || string(bytes.TrimSpace(value)) == "0" {
			continue
		}
		lines[i] = append(bytes.Clone(l[:len(l)-len(value)]), " 0"...)
		changed = true
	}
	return bytes.Join(lines, []byte("\n")), changed
}
