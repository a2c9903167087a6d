package native

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/isolator"
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
// and nodes (the control devices and the container's GPUs).
func makeDev(dir string, nodes []isolator.DeviceNode) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := linux.MountDevTmpfs(dir); err != nil {
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

// addNode creates one device node in a container's /dev with the number,
// permissions and ownership of the host's node.
func addNode(dir string, n isolator.DeviceNode) error {
	perm := os.FileMode(0o666)
	if fi, err := os.Stat(n.HostPath); err == nil {
		perm = fi.Mode().Perm()
	}
	p := filepath.Join(dir, filepath.Base(n.Path))
	err := linux.Mknod(p, perm, linux.DeviceNumber{Char: true, Major: n.Major, Minor: n.Minor})
	if errors.Is(err, fs.ErrExist) {
		if have, serr := linux.StatDevice(p); serr == nil && have.Major == n.Major && have.Minor == n.Minor {
			return nil
		}
	}
	if err != nil {
		return fmt.Errorf("device node %s: %w", n.Path, err)
	}
	return nil
}

// removeNode deletes a node from a container's /dev.
func removeNode(dir string, n isolator.DeviceNode) error {
	err := os.Remove(filepath.Join(dir, filepath.Base(n.Path)))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}

// removeDev unmounts a container's /dev and removes its directory.
func removeDev(dir string) error {
	// EINVAL: not mounted (any more); ENOENT: never made.
	if err := linux.DetachUnmount(dir); err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.EINVAL) {
		return err
	}
	return os.RemoveAll(dir)
}
