package hwtest_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/containerizer/native"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/isolator/cgroups"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/volume"
)

// smiGPU matches a GPU line of nvidia-smi -L (MIG devices are indented).
var smiGPU = regexp.MustCompile(`^GPU (\d+): .*\(UUID: (GPU-[0-9a-fA-F-]+)\)`)

// smiList returns the GPU UUIDs in the output of nvidia-smi -L.
func smiList(out string) []string {
	var uuids []string
	for _, line := range strings.Split(out, "\n") {
		if m := smiGPU.FindStringSubmatch(line); m != nil {
			uuids = append(uuids, m[2])
		}
	}
	return uuids
}

// realNode is the host's own node: its inventory as Discover reads it with
// the defaults, and a native containerizer over it with its own cgroup
// parent, volume root and state directory, all removed when the test ends.
type realNode struct {
	inv   *node.Inventory
	c     *native.Containerizer
	check string // cudacheck
	probe string
}

func newRealNode(t *testing.T) *realNode {
	t.Helper()
	testenv.RequireGPU(t)
	testenv.RequireRoot(t)
	ctx := context.Background()
	inv, err := nvmlnode.Discover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	alloc, err := allocator.New(inv)
	if err != nil {
		t.Fatal(err)
	}
	parent := fmt.Sprintf("gpuiso-hwtest-%d", os.Getpid())
	iso, err := cgroups.New(cgroups.WithParent(parent))
	if err != nil {
		t.Fatal(err)
	}
	vols, err := volume.New(volume.WithRoot(filepath.Join(t.TempDir(), "volumes")))
	if err != nil {
		t.Fatal(err)
	}
	c, err := native.New(native.Config{Allocator: alloc, Inventory: inv, Isolator: iso, Volumes: vols, StateDir: filepath.Join(t.TempDir(), "state")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, ct := range c.Containers() {
			c.Destroy(context.Background(), ct.ID)
		}
		os.Remove(filepath.Dir(iso.Path("x")))
	})
	return &realNode{inv: inv, c: c, check: cudaCheck(t), probe: testenv.BuildProbe(t)}
}

// run launches a container with req, runs script in it with CUDACHECK and
// PROBE set, waits, and returns its output; the script must exit 0.
func (n *realNode) run(t *testing.T, id string, req allocator.Request, script string) string {
	t.Helper()
	ctx := context.Background()
	var out bytes.Buffer
	_, err := n.c.Launch(ctx, containerizer.Spec{ID: id, Command: []string{"/bin/sh", "-c", script}, GPUs: req,
		Env: []string{"CUDACHECK=" + n.check, "PROBE=" + n.probe}, Stdout: &out, Stderr: &out})
	if err != nil {
		t.Fatalf("launch %s with %+v: %v", id, req, err)
	}
	defer n.c.Destroy(ctx, id)
	st, err := n.c.Wait(ctx, id)
	if err != nil || st.Code != 0 {
		t.Fatalf("container %s: exit %d, %v\n%s", id, st.Code, err, out.String())
	}
	t.Logf("container %s:\n%s", id, out.String())
	return out.String()
}

// TestDiscoverEveryGPU compares discovery with nvidia-smi -L, GPU by GPU.
func TestDiscoverEveryGPU(t *testing.T) {
	testenv.RequireGPU(t)
	inv, err := nvmlnode.Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("nvidia-smi", "-L").Output()
	if err != nil {
		t.Fatalf("nvidia-smi -L: %v", err)
	}
	want := smiList(string(out))
	var got []string
	for _, d := range inv.Devices {
		got = append(got, d.UUID)
		t.Logf("GPU %d: %s %s %s %s MIG %s, node %s", d.Index, d.Model, d.BusID, d.UUID, d.Health, d.MIG, d.Node)
		if d.Node.Path == "" || d.Node.Major == 0 {
			t.Errorf("GPU %d has no device node: %+v", d.Index, d.Node)
		}
	}
	if len(want) == 0 || !slices.Equal(got, want) {
		t.Fatalf("discovered %v, nvidia-smi -L lists %v:\n%s", got, want, out)
	}
}

// cudaGPU picks the GPU for the CUDA container: the first not in MIG mode
// (the suite never changes a GPU's mode).
func cudaGPU(t *testing.T, inv *node.Inventory) node.Device {
	t.Helper()
	for _, d := range inv.Devices {
		if d.MIG != node.MIGEnabled && d.Health.Healthy {
			return d
		}
	}
	t.Skip("every GPU is in MIG mode or unhealthy; the suite does not change MIG mode")
	return node.Device{}
}

// TestCUDAOneGPU gives a native container one GPU: CUDA works there, on
// exactly that GPU, and nvidia-smi sees that GPU alone.
func TestCUDAOneGPU(t *testing.T) {
	n := newRealNode(t)
	gpu := cudaGPU(t, n.inv)
	script := `
		$CUDACHECK; echo "cudacheck exit $?"
		nvidia-smi -L
		echo "env NVIDIA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES"`
	var other *node.Device
	for i := range n.inv.Devices {
		if d := &n.inv.Devices[i]; d.Index != gpu.Index && d.Node.Path != "" {
			other = d
			break
		}
	}
	if other != nil {
		script += fmt.Sprintf("\n$PROBE mknod /dev/hwtest-other %d %d; $PROBE open /dev/hwtest-other", other.Node.Major, other.Node.Minor)
	}
	out := n.run(t, "hwtest-one", allocator.Request{Devices: []string{strconv.Itoa(gpu.Index)}}, script)
	if !strings.Contains(out, "cudacheck exit 0\n") || !strings.Contains(out, "cudacheck: ok: 1 device ") {
		t.Errorf("CUDA does not work on GPU %d (%s) in its container:\n%s", gpu.Index, gpu.UUID, out)
	}
	if got := smiList(out); len(got) != 1 || got[0] != gpu.UUID {
		t.Errorf("nvidia-smi -L in the container lists %v, want only %s:\n%s", got, gpu.UUID, out)
	}
	if !strings.Contains(out, "env NVIDIA_VISIBLE_DEVICES="+gpu.UUID+"\n") {
		t.Errorf("NVIDIA_VISIBLE_DEVICES does not name %s:\n%s", gpu.UUID, out)
	}
	if other != nil && !strings.Contains(out, "/dev/hwtest-other EPERM\n") {
		t.Errorf("a self-made node of GPU %d (%d:%d) is usable in a container holding GPU %d:\n%s", other.Index, other.Node.Major, other.Node.Minor, gpu.Index, out)
	}
}

// TestCUDANoGPU gives a native container no GPU: CUDA finds no device, the
// GPUs' nodes are not in its /dev, before CUDA ran or after (the driver's
// libraries, run as root, make the nodes they miss unless the driver's
// parameters say ModifyDeviceFiles: 0, as the container's /proc does), and
// a node it makes itself for a GPU cannot be opened.
func TestCUDANoGPU(t *testing.T) {
	n := newRealNode(t)
	gpu := n.inv.Devices[0]
	script := fmt.Sprintf(`
		$PROBE open %[1]s
		grep -h ModifyDeviceFiles /proc/driver/nvidia/params | sed 's/^/params: /'
		$CUDACHECK; echo "cudacheck exit $?"
		$PROBE ls /dev | grep '^nvidia' | sed 's/^/after cuda: /'
		$PROBE open %[1]s
		$PROBE mknod /dev/hwtest-gpu %[2]d %[3]d
		$PROBE open /dev/hwtest-gpu`, gpu.Node.Path, gpu.Node.Major, gpu.Node.Minor)
	out := n.run(t, "hwtest-none", allocator.Request{}, script)
	if !strings.Contains(out, fmt.Sprintf("cudacheck exit %d\n", cudaNoDevice)) {
		t.Errorf("CUDA in a container without GPUs does not report \"no device\":\n%s", out)
	}
	if got := strings.Count(out, gpu.Node.Path+" ENOENT\n"); got != 2 {
		t.Errorf("%s is in the /dev of a container without GPUs (%d of 2 opens gave ENOENT, before and after CUDA ran):\n%s", gpu.Node.Path, got, out)
	}
	if !strings.Contains(out, "params: ModifyDeviceFiles: 0\n") {
		t.Errorf("the driver's parameters in the container's /proc do not say ModifyDeviceFiles: 0:\n%s", out)
	}
	for _, l := range strings.Split(out, "\n") {
		if name, ok := strings.CutPrefix(l, "after cuda: "); ok && strings.Trim(strings.TrimPrefix(name, "nvidia"), "0123456789") == "" {
			t.Errorf("after CUDA ran, the /dev of a container without GPUs holds %s", name)
		}
	}
	if !strings.Contains(out, "/dev/hwtest-gpu EPERM\n") {
		t.Errorf("a self-made node of GPU %d (%d:%d) is not EPERM in a container without GPUs:\n%s", gpu.Index, gpu.Node.Major, gpu.Node.Minor, out)
	}
}
