package main

import (
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
)

// TestNoGPUs runs an image without GPUs on a simulated GPU node: no GPU
// node, nothing held, NVIDIA_VISIBLE_DEVICES=void.
func TestNoGPUs(t *testing.T) {
	testenv.RequireRoot(t)
	cli := testenv.RequireDocker(t)
	testenv.LockDocker(t, false)
	img := testenv.BuildProbeImage(t, cli, testenv.ProbeImage{})
	out, errOut, code := dockerrun("--simulate", "dgx1-volta", "--gpus", "0", img, "do", "ls", "/dev", "--", "env", "NVIDIA_VISIBLE_DEVICES")
	if code != 0 {
		t.Fatalf("exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
	}
	for l := range strings.Lines(out) {
		if name := strings.TrimSpace(l); strings.HasPrefix(name, "nvidia") && strings.Trim(name[len("nvidia"):], "0123456789") == "" {
			t.Errorf("a container without GPUs has /dev/%s", name)
		}
	}
	if !strings.Contains(out, "NVIDIA_VISIBLE_DEVICES=void\n") {
		t.Errorf("NVIDIA_VISIBLE_DEVICES is not void:\n%s", out)
	}
}
