package native

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/isolator"
)

// TestKeepDeviceNodes: over a /proc's driver parameters goes a read-only
// copy that says ModifyDeviceFiles: 0; a /proc without an NVIDIA driver is
// left as it is. The /proc here is a directory of the test's (the bind is
// undone when it ends).
func TestKeepDeviceNodes(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	proc := filepath.Join(dir, "proc")
	params := filepath.Join(proc, driverParams)
	if err := os.MkdirAll(filepath.Dir(params), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(params, []byte("RmLogonRC: 1\nModifyDeviceFiles: 1\nDeviceFileMode: 438\n"), 0o444); err != nil {
		t.Fatal(err)
	}
	scratch := filepath.Join(dir, driverParamsCopy)
	if err := keepDeviceNodes(proc, scratch); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { linux.DetachUnmount(params) })
	b, err := os.ReadFile(params)
	if err != nil || string(b) != "RmLogonRC: 1\nModifyDeviceFiles: 0\nDeviceFileMode: 438\n" {
		t.Errorf("the driver's parameters now read %q, %v", b, err)
	}
	if err := os.WriteFile(params, []byte("ModifyDeviceFiles: 1\n"), 0o644); err == nil {
		t.Error("the copy over the driver's parameters is writable")
	}
	none := filepath.Join(dir, "no-driver")
	if err := os.Mkdir(none, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := keepDeviceNodes(none, filepath.Join(dir, "unused")); err != nil {
		t.Errorf("a /proc without the NVIDIA driver: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "unused")); err == nil {
		t.Error("a copy was written for a /proc without the NVIDIA driver")
	}
}

// mountedAt reports whether something is mounted at path in the test's
// mount namespace.
func mountedAt(t *testing.T, path string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == path {
			return true
		}
	}
	return false
}

// TestNodesStayInDev: a running container's root writes its /dev, which a
// live update adds GPU nodes to and removes them from on the host's side.
// A link it plants there (nvidia-caps to a host directory, a GPU's name to
// a host file) is never followed out of its /dev: the node is made and
// bound inside it, and removing a node removes it there, never what a
// link names outside (links are followed inside /dev, as the container's own view
// does).
func TestNodesStayInDev(t *testing.T) {
	testenv.RequireRoot(t)
	dev, host := filepath.Join(t.TempDir(), "dev"), t.TempDir()
	if err := os.Mkdir(dev, 0o755); err != nil {
		t.Fatal(err)
	}
	// The host's files a container would aim at.
	victim := filepath.Join(host, "nvidia1")
	if err := os.WriteFile(victim, []byte("host"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(host, filepath.Join(dev, "nvidia-caps")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, filepath.Join(dev, "nvidia1")); err != nil {
		t.Fatal(err)
	}
	capNode := isolator.DeviceNode{Path: "/dev/nvidia-caps/nvidia-cap12", HostPath: "/dev/null", Major: 1, Minor: 3}
	gpuNode := isolator.DeviceNode{Path: "/dev/nvidia1", HostPath: "/dev/zero", Major: 1, Minor: 5}
	inside := filepath.Join(dev, host, "nvidia-cap12") // the link's target, taken inside /dev
	t.Cleanup(func() {
		for _, p := range []string{inside, filepath.Join(host, "nvidia-cap12"), filepath.Join(dev, "nvidia1"), victim} {
			linux.DetachUnmount(p)
		}
	})
	if err := addNode(dev, capNode); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(host, "nvidia-cap12")); err == nil || mountedAt(t, filepath.Join(host, "nvidia-cap12")) {
		t.Fatal("the node was made in the host directory the container's link names")
	}
	if d, err := linux.StatDevice(inside); err != nil || d.Major != 1 || d.Minor != 3 || !mountedAt(t, inside) {
		t.Fatalf("the node inside /dev: %+v, %v", d, err)
	}
	// A host file by the node's name, behind the link, outlives the node.
	if err := os.WriteFile(filepath.Join(host, "nvidia-cap12"), []byte("host"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := removeNode(dev, capNode); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(host, "nvidia-cap12")); err != nil {
		t.Errorf("removing the node removed the host's file by its name: %v", err)
	}
	if _, err := os.Lstat(inside); err == nil || mountedAt(t, inside) {
		t.Error("the node inside /dev is still there")
	}

	// A GPU's name linked to a host file: the node is bound where the
	// link leads inside /dev, never on the host file, and removed from
	// there.
	gpuInside := filepath.Join(dev, victim)
	t.Cleanup(func() { linux.DetachUnmount(gpuInside) })
	if err := addNode(dev, gpuNode); err != nil {
		t.Fatal(err)
	}
	if mountedAt(t, victim) || !mountedAt(t, gpuInside) {
		t.Fatalf("the GPU node: on the host file %v, inside /dev %v", mountedAt(t, victim), mountedAt(t, gpuInside))
	}
	if err := removeNode(dev, gpuNode); err != nil {
		t.Fatal(err)
	}
	if mountedAt(t, gpuInside) {
		t.Error("the GPU node is still bound inside /dev")
	}
	if b, err := os.ReadFile(victim); err != nil || string(b) != "host" {
		t.Errorf("the host file behind the link: %q, %v", b, err)
	}
}
