package main

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
)

// TestRuncMIG runs a bundle asking for one MIG device by its UUID through
// gpuiso-runtime run and runc, on a simulated node with MIG enabled: the
// container gets the parent GPU's node and the device's two capability
// nodes, open (allowed), and no other GPU's node; NVIDIA_VISIBLE_DEVICES
// names the MIG device.
func TestRuncMIG(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireNVIDIALibraries(t)
	testenv.RequireRunc(t)
	bin := buildRuntime(t)
	sim, _, _ := simNode(t, "hgx-h100-mig")
	n, err := simnode.New("hgx-h100-mig")
	if err != nil {
		t.Fatal(err)
	}
	host := &simnode.Host{Root: sim, DevRoot: sim + "/dev", ProcRoot: sim + "/proc", SysRoot: sim + "/sys"}
	inv, err := nvmlnode.Discover(context.Background(), n.DiscoverOptions(host)...)
	if err != nil {
		t.Fatal(err)
	}
	var parent int
	var mig, giCap, ciCap string
	for _, d := range inv.Devices {
		if len(d.MIGDevices) > 0 {
			m := d.MIGDevices[0]
			parent, mig = d.Index, m.UUID
			giCap, ciCap = filepath.Base(m.GIAccess.Path), filepath.Base(m.CIAccess.Path)
			break
		}
	}
	if mig == "" {
		t.Fatal("the simulated node has no MIG device")
	}
	minor := inv.Devices[parent].Node.Minor

	dir := probeBundle(t, testenv.BuildProbe(t), func(proc map[string]any) {
		proc["args"] = []string{"/probe", "do", "ls", "/dev", "--", "ls", "/dev/nvidia-caps", "--",
			"open", fmt.Sprintf("/dev/nvidia%d", minor), "/dev/nvidia-caps/" + giCap, "/dev/nvidia-caps/" + ciCap, "--", "env", "NVIDIA_VISIBLE_DEVICES"}
		proc["env"] = append(proc["env"].([]any), "NVIDIA_VISIBLE_DEVICES="+mig)
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	id := fmt.Sprintf("gpuiso-mig-%d", time.Now().UnixNano())
	out, err := exec.CommandContext(ctx, bin, "--simulate", "hgx-h100-mig", "--dev-root", sim, "--root", t.TempDir(), "--accept-env-request", "always", "run", "--bundle", dir, id).CombinedOutput()
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out)
	}
	lines := map[string]bool{}
	var gpuNodes []string
	for l := range strings.Lines(string(out)) {
		l = strings.TrimSpace(l)
		lines[l] = true
		if isGPUNode(l) {
			gpuNodes = append(gpuNodes, l)
		}
	}
	want := fmt.Sprintf("nvidia%d", minor)
	if len(gpuNodes) != 1 || gpuNodes[0] != want || !lines[giCap] || !lines[ciCap] {
		t.Errorf("want only %s and capability nodes %s, %s:\n%s", want, giCap, ciCap, out)
	}
	for _, p := range []string{"/dev/" + want, "/dev/nvidia-caps/" + giCap, "/dev/nvidia-caps/" + ciCap} {
		if !testenv.Opened(lines, p) {
			t.Errorf("%s does not open:\n%s", p, out)
		}
	}
	if !lines["NVIDIA_VISIBLE_DEVICES="+mig] {
		t.Errorf("NVIDIA_VISIBLE_DEVICES is not %s:\n%s", mig, out)
	}
}
