package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/node/simnode"
)

// binEnv points the end-to-end suites at a prebuilt gpuiso-runtime.
const binEnv = "GPUISO_RUNTIME_BIN"

// buildRuntime returns the path of a gpuiso-runtime binary: the one binEnv
// names, else one built with the go command into a directory the daemons
// can reach.
func buildRuntime(t testing.TB) string {
	t.Helper()
	if p := os.Getenv(binEnv); p != "" {
		return p
	}
	if _, err := exec.LookPath("go"); err != nil {
		t.Fatalf("no %s and no go command to build gpuiso-runtime: %v", binEnv, err)
	}
	dir, err := os.MkdirTemp("", "gpuiso-runtime-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	out := filepath.Join(dir, "gpuiso-runtime")
	cmd := exec.Command("go", "build", "-buildvcs=false", "-o", out, "github.com/gpuiso/gpuiso/cmd/gpuiso-runtime")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build gpuiso-runtime: %v\n%s", err, b)
	}
	return out
}

// simNode makes the host tree of the simulated node name under a directory
// that lives as long as the test (gpuiso-runtime --dev-root uses it as it
// is) and returns the directory, the GPUs' major and their number.
func simNode(t testing.TB, name string) (dir string, major uint32, gpus int) {
	t.Helper()
	testenv.RequireRoot(t)
	n, err := simnode.New(name)
	if err != nil {
		t.Fatal(err)
	}
	dir, err = os.MkdirTemp("", "gpuiso-sim-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	h, err := n.MakeHost(dir)
	if err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(h.DevRoot)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if isGPUNode(e.Name()) {
			gpus++
		}
	}
	return dir, h.NVIDIAMajor, gpus
}

func isGPUNode(name string) bool {
	rest, ok := strings.CutPrefix(name, "nvidia")
	return ok && rest != "" && strings.Trim(rest, "0123456789") == ""
}

// probeArgs are the probe's questions: the names in /dev, a read-write open
// of each GPU node /dev/nvidiaI, then of a node the container makes itself
// for each GPU (/dev/gI, the GPU's numbers), the GPU environment, and the
// driver volume's listing and writability.
func probeArgs(major uint32, gpus int) []string {
	args := []string{"do", "ls", "/dev", "--", "open"}
	for i := range gpus {
		args = append(args, fmt.Sprintf("/dev/nvidia%d", i))
	}
	for i := range gpus {
		args = append(args, "--", "mknod", fmt.Sprintf("/dev/g%d", i), strconv.Itoa(int(major)), strconv.Itoa(i), "open")
	}
	return append(args, "--", "env", "NVIDIA_VISIBLE_DEVICES", "--", "ls", "/usr/local/nvidia", "--", "write", "/usr/local/nvidia/x")
}

// Expect is what a container must see.
type Expect struct {
	GPUs    []int // the GPUs whose nodes it has and may open
	Control bool  // /dev/nvidiactl present
	Volume  bool  // the driver volume read-only at /usr/local/nvidia
}

// checkIsolation compares the probe's answers (see probeArgs) with want:
// exactly want's GPU nodes in /dev, each allowed (ENXIO: no driver behind
// a simulated major), every other GPU's node absent, and its self-made
// node denied by the device cgroup (EPERM); NVIDIA_VISIBLE_DEVICES naming
// as many GPUs; the volume present and read-only, or absent.
func checkIsolation(t *testing.T, out string, gpus int, want Expect) {
	t.Helper()
	lines := map[string]bool{}
	var nodes []string
	for l := range strings.Lines(out) {
		l = strings.TrimSpace(l)
		lines[l] = true
		if isGPUNode(l) {
			nodes = append(nodes, l)
		}
	}
	var wantNodes []string
	for _, i := range want.GPUs {
		wantNodes = append(wantNodes, fmt.Sprintf("nvidia%d", i))
	}
	slices.Sort(nodes)
	slices.Sort(wantNodes)
	if !slices.Equal(nodes, wantNodes) {
		t.Errorf("GPU nodes in /dev: %q, want %q", nodes, wantNodes)
	}
	if lines["nvidiactl"] != want.Control {
		t.Errorf("/dev/nvidiactl present: %v, want %v", lines["nvidiactl"], want.Control)
	}
	for i := range gpus {
		node, own := fmt.Sprintf("/dev/nvidia%d", i), fmt.Sprintf("/dev/g%d", i)
		if slices.Contains(want.GPUs, i) {
			if !testenv.Opened(lines, node) || !lines[own+" ok"] || !testenv.Opened(lines, own) {
				t.Errorf("GPU %d: want its node and a self-made one to open (allowed)", i)
			}
		} else if !lines[node+" ENOENT"] || !lines[own+" ok"] || !lines[own+" EPERM"] {
			t.Errorf("GPU %d: want no node, and a self-made one made but denied (EPERM)", i)
		}
	}
	visible := ""
	for l := range lines {
		if v, ok := strings.CutPrefix(l, "NVIDIA_VISIBLE_DEVICES="); ok {
			visible = v
		}
	}
	switch {
	case len(want.GPUs) > 0:
		if ids := strings.Split(visible, ","); len(ids) != len(want.GPUs) || !strings.HasPrefix(ids[0], "GPU-") {
			t.Errorf("NVIDIA_VISIBLE_DEVICES=%s, want %d UUIDs", visible, len(want.GPUs))
		}
	case want.Control:
		if visible != "void" {
			t.Errorf("NVIDIA_VISIBLE_DEVICES=%s, want void", visible)
		}
	}
	if want.Volume {
		if !lines["bin"] || !lines["/usr/local/nvidia/x EROFS"] {
			t.Errorf("no read-only driver volume at /usr/local/nvidia")
		}
	} else if !lines["/usr/local/nvidia ENOENT"] {
		t.Errorf("/usr/local/nvidia exists without a request for it")
	}
	if t.Failed() {
		t.Logf("probe output:\n%s", out)
	}
}

// isolationCases are the requests every client's suite runs on an 8-GPU
// simulated node, with what the container must see.
var isolationCases = []struct {
	name string
	env  string // NVIDIA_VISIBLE_DEVICES, "" for unset
	want Expect
}{
	{name: "two GPUs", env: "2,3", want: Expect{GPUs: []int{2, 3}, Control: true, Volume: true}},
	{name: "all", env: "all", want: Expect{GPUs: []int{0, 1, 2, 3, 4, 5, 6, 7}, Control: true, Volume: true}},
	{name: "none", env: "none", want: Expect{Control: true, Volume: true}},
	{name: "void", env: "void"},
	{name: "unset"},
}
