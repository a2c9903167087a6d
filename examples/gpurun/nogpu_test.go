package main

import (
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
)

// TestNoGPUs runs a CPU job on a simulated GPU node: it has no GPU node, a
// node it makes itself of any GPU (on the major of the node's nvidiactl,
// which the simulated GPUs share) is denied, and its environment names no
// GPU.
func TestNoGPUs(t *testing.T) {
	testenv.RequireRoot(t)
	versions := testenv.CgroupVersions(t)
	probe := testenv.BuildProbe(t)
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			out, errOut, code := gpurun("--simulate", "dgx1-volta", "--gpus", "0", "--cgroup", v, "--", "/bin/sh", "-c", `
				ls /dev | grep '^nvidia[0-9]' | sed 's/^/dev: /'
				major=$((0x$(stat -c %t /dev/nvidiactl)))
				for m in 0 1 2 3 4 5 6 7; do mknod /dev/gpu$m c $major $m; done
				`+probe+` open /dev/gpu0 /dev/gpu1 /dev/gpu2 /dev/gpu3 /dev/gpu4 /dev/gpu5 /dev/gpu6 /dev/gpu7
				echo "visible=$NVIDIA_VISIBLE_DEVICES"`)
			if code != 0 {
				t.Fatalf("exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
			}
			if strings.Contains(out, "dev: ") {
				t.Errorf("a container without GPUs has GPU nodes:\n%s", out)
			}
			if n := strings.Count(out, " EPERM\n"); n != 8 {
				t.Errorf("%d of 8 self-made GPU nodes denied:\n%s", n, out)
			}
			if !strings.Contains(out, "visible=void\n") {
				t.Errorf("NVIDIA_VISIBLE_DEVICES is not void:\n%s", out)
			}
			if !strings.Contains(errOut, "no GPUs") {
				t.Errorf("stderr = %q", errOut)
			}
		})
	}
}
