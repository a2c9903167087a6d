package deviceplugin_test

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/nomad/internal/proto/device"
)

// buildRuntime builds gpuiso-runtime from the core module.
func buildRuntime(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "gpuiso-runtime")
	cmd := exec.Command("go", "build", "-buildvcs=false", "-o", out, "./cmd/gpuiso-runtime")
	cmd.Dir = filepath.Join("..", "..")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build gpuiso-runtime: %v\n%s", err, b)
	}
	return out
}

// TestDockerRuntime: in runtime mode, a container that Nomad's docker
// driver would start with nvidia_runtime = "gpuiso" (the reservation's
// environment as -e, the runtime switched because it names
// NVIDIA_VISIBLE_DEVICES) sees exactly its GPUs' nodes, and can open them.
func TestDockerRuntime(t *testing.T) {
	testenv.RequireNVIDIALibraries(t)
	s := simulate(t, "dgx1-volta")
	rt := buildRuntime(t)
	d := testenv.StartDockerd(t, map[string]any{"runtimes": map[string]any{"gpuiso": map[string]any{
		"path":        rt,
		"runtimeArgs": []string{"--simulate", s.name, "--dev-root", s.devRoot, "--state-dir", s.stateDir},
	}}})
	img := testenv.BuildProbeImage(t, d.Client, testenv.ProbeImage{})
	l := load(t, s.config(map[string]any{"env": "runtime"}))
	l.fingerprints(t).until(t, "a fingerprint", func(*device.FingerprintResponse) bool { return true })
	for _, gpus := range [][]int{{2}, {5, 6}} {
		var ids, want []string
		for _, i := range gpus {
			ids = append(ids, s.inv.Devices[i].UUID)
			want = append(want, s.inv.Devices[i].NodeName())
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		res, err := l.device.Reserve(ctx, &device.ReserveRequest{DeviceIds: ids})
		if err != nil {
			t.Fatal(err)
		}
		args := []string{"run", "--rm", "--network", "none", "--runtime", "gpuiso"}
		for k, v := range res.GetContainerRes().GetEnvs() {
			args = append(args, "-e", k+"="+v)
		}
		args = append(args, img, "do", "ls", "/dev", "--", "open")
		for _, n := range want {
			args = append(args, "/dev/"+n)
		}
		out, err := d.Docker(ctx, args...)
		if err != nil {
			t.Fatalf("docker %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		var nodes []string
		lines := map[string]bool{}
		for l := range strings.Lines(out) {
			l = strings.TrimSpace(l)
			lines[l] = true
			if strings.HasPrefix(l, "nvidia") && strings.Trim(strings.TrimPrefix(l, "nvidia"), "0123456789") == "" && l != "nvidia" {
				nodes = append(nodes, l)
			}
		}
		slices.Sort(nodes)
		if !slices.Equal(nodes, want) {
			t.Errorf("GPUs %v: /dev holds %v, want %v\n%s", gpus, nodes, want, out)
		}
		for _, n := range want {
			// A simulated GPU's node opens to ENXIO where the device
			// cgroup lets it (no driver answers), EPERM where it does not.
			if !lines[fmt.Sprintf("/dev/%s ENXIO", n)] {
				t.Errorf("GPUs %v: /dev/%s not allowed:\n%s", gpus, n, out)
			}
		}
	}
}
