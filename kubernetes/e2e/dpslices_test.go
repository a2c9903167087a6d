package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/isolator/mps"
)

// TestDevicePluginMPSSlices serves a simulated DGX-1 (Volta) through the
// device plugin alone, its GPU 0 (16 GiB) as two concurrent slices
// (--shared-gpus 0 --time-slices 2 --device-plugin-sharing mps): two pods
// asking for nvidia.com/gpu.shared: 1 each see from inside GPU 0 alone,
// CUDA_MPS_PIPE_DIRECTORY, a limit of half the GPU's memory and the pipe
// directory of the GPU's one MPS daemon, where the marks of both are;
// the daemon holds 8 GiB (half) as it answers. Once the pods end, the
// plugin gives the slices back and the daemon is stopped.
func TestDevicePluginMPSSlices(t *testing.T) {
	c := requireCluster(t)
	testenv.RequireSimulatedMPS(t)
	const shared = "nvidia.com/gpu.shared"
	// The plugin runs on the host, whose mounts do not reach the node's
	// mount namespace: plain directories.
	p := startPlugin(t, c, "dgx1-volta", "--dra=false", "--shared-gpus", "0", "--time-slices", "2",
		"--device-plugin-sharing", "mps", "--mps-plain-dirs")
	mpsDir := filepath.Join(p.stateDir, "mps-deviceplugin")
	t.Cleanup(func() {
		if ds, _ := mps.Daemons(context.Background(), mpsDir); len(ds) > 0 {
			t.Errorf("MPS daemons left after the pods ended: %+v", ds)
			if m, err := mps.New(mpsDir); err == nil {
				m.Sweep(context.Background(), nil)
				m.Close()
			}
		}
	})
	inv := p.inventory()
	byUUID, all := minorsOf(inv)
	major := p.major()
	gpu := inv.Devices[0]
	if gpu.MemoryBytes != 16<<30 {
		t.Fatalf("the shared GPU has %d bytes, want 16 GiB", gpu.MemoryBytes)
	}
	until(t, "7 whole GPUs and 2 concurrent slices", func() bool {
		return allocatable(t, c, gpuResource) == 7 && allocatable(t, c, shared) == 2
	})
	names := []string{"mpsslice-a", "mpsslice-b"}
	for _, name := range names {
		createPod(t, c, withGPUs(probePod(name, shareArgs(major, all, name)), shared, 1))
	}
	owner := mps.SliceOwner(gpu.UUID)
	for _, name := range names {
		out := podOutput(t, c, name)
		s := parseSeen(out)
		s.check(t, all, []int{byUUID[gpu.UUID]}, []string{gpu.UUID})
		if s.env["CUDA_MPS_PIPE_DIRECTORY"] != "/tmp/nvidia-mps" || s.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] != "0=8192M" {
			t.Errorf("pod %s: MPS environment %v, want the pipe directory and 0=8192M", name, s.env)
		}
		for _, want := range []string{"/tmp/nvidia-mps/seen-by-" + name + " ok", "/dev/shm/seen-by-" + name + " ok", "control\n"} {
			if !strings.Contains(out, want) {
				t.Errorf("pod %s: no %q in what it saw:\n%s", name, strings.TrimSpace(want), out)
			}
		}
	}
	ds, err := mps.Daemons(t.Context(), mpsDir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) != 1 || ds[0].Owner != owner || !ds[0].Alive || ds[0].Slices != 2 {
		t.Fatalf("daemons %+v, want the one of GPU 0's two slices", ds)
	}
	for _, name := range names {
		for _, f := range []string{filepath.Join(ds[0].PipeDir, "seen-by-"+name), filepath.Join(ds[0].ShmDir, "seen-by-"+name)} {
			if _, err := os.Stat(f); err != nil {
				t.Errorf("pod %s's mark in the daemon's directories: %v", name, err)
			}
		}
	}
	m, err := mps.New(mpsDir)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	held, err := m.Held(t.Context(), owner)
	if err != nil || !held.MemorySet || held.MemoryMinMiB > 8192 || held.MemoryMaxMiB < 8192 || held.ComputePercent != 50 {
		t.Errorf("the daemon holds %+v (%v), want 8192 MiB and 50%%", held, err)
	}
	for _, name := range names {
		deletePod(t, c, name)
	}
	until(t, "the slices given back and their daemon stopped", func() bool {
		ds, err := mps.Daemons(context.Background(), mpsDir)
		return err == nil && len(ds) == 0
	})
}
