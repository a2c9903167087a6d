package main

import (
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
)

// TestMIGShareRun: --mig beside a share flag runs the command in a share
// of one MIG device: a memory share of a 1g.10gb device, then one of two
// slices of a 3g.40gb device (40448 MiB), each seeing the MIG device alone
// (NVIDIA_VISIBLE_DEVICES its "MIG-" UUID) and reaching its MPS daemon,
// whose limits the MPS control client reads from inside; afterwards no
// daemon, directory or allocation is left.
func TestMIGShareRun(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCgroupV2(t)
	bin := testenv.RequireSimulatedMPS(t)
	dir := t.TempDir()
	t.Cleanup(func() { killDaemons(dir) })
	script := `env | grep -E "^(CUDA_MPS|NVIDIA_VISIBLE_DEVICES)" | sort; ls /tmp/nvidia-mps
		echo "threads $(echo get_default_active_thread_percentage | ` + bin + `)"`
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"memory share", []string{"--mig", "1g.10gb", "--gpu-memory", "2GiB", "--gpu-compute", "40"},
			[]string{"NVIDIA_VISIBLE_DEVICES=MIG-", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=2048M\n", "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps\n", "control\n", "threads 40"}},
		{"slice", []string{"--mig", "3g.40gb", "--gpu-slices", "2"},
			[]string{"NVIDIA_VISIBLE_DEVICES=MIG-", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20224M\n", "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps\n", "control\n", "threads 50"}},
	} {
		args := append([]string{"--simulate", "hgx-h100-mig", "--state-dir", dir}, tc.args...)
		out, errOut, code := gpurun(append(args, "--", "sh", "-c", script)...)
		if code != 0 {
			t.Fatalf("%s: exit %d: %s%s", tc.name, code, out, errOut)
		}
		for _, want := range tc.want {
			if !strings.Contains(out, want) {
				t.Errorf("%s: output lacks %q:\n%s", tc.name, want, out)
			}
		}
		if strings.Contains(out, "NVIDIA_VISIBLE_DEVICES=GPU-") || strings.Contains(out, ",") {
			t.Errorf("%s: the command sees more than its MIG device:\n%s", tc.name, out)
		}
	}
	sharesLeft(t, dir)
}
