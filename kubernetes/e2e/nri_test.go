package e2e

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/isolator"
)

// cpusAllowed is the CPU list a probe's "status" step printed
// (Cpus_allowed_list), parsed.
func cpusAllowed(t *testing.T, out string) []int {
	t.Helper()
	for _, l := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(l, "Cpus_allowed_list:"); ok {
			list, err := isolator.ParseList(strings.TrimSpace(v))
			if err != nil {
				t.Fatal(err)
			}
			return list
		}
	}
	t.Fatalf("no Cpus_allowed_list in the pod's output:\n%s", out)
	return nil
}

func readCPUList(t *testing.T, path string) []int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	list, err := isolator.ParseList(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return list
}

// TestNRI: with --nri-policy numa, the plugin serves the node's
// containerd's NRI, and a pod whose claim holds a GPU of the simulated
// node's NUMA node 1 runs on that node's CPUs alone (the simulated tree
// gives each of its NUMA nodes a part of the host's CPUs); a pod without a
// GPU keeps every CPU; with policy none a GPU pod keeps every CPU too.
func TestNRI(t *testing.T) {
	c := requireCluster(t)
	ensureClasses(t, c)
	all := readCPUList(t, "/sys/devices/system/cpu/online")
	if len(all) < 2 {
		t.Skipf("the host has %d CPU: a NUMA node's CPUs would be all of them", len(all))
	}
	status := []string{"do", "status", "--", "cwd", "--", "sleep", "100000"}
	claimTemplate(t, c, "numa1-gpu", "gpu.gpuiso.io", 1, "", `device.attributes["gpu.gpuiso.io"].numaNode == 1`)

	t.Run("numa", func(t *testing.T) {
		p := startPlugin(t, c, "dgx1-volta", "--device-plugin=false", "--nri-policy=numa", "--nri-socket="+c.Nodes[0].NRISocket())
		p.inventory()
		until(t, "the slice's 8 GPUs", func() bool { return len(sliceDevices(t, c)) == 8 })
		until(t, "the plugin to serve NRI", func() bool { return strings.Contains(p.log.String(), "NRI: serving the runtime") })
		node1 := readCPUList(t, filepath.Join(p.devRoot, "sys", "devices", "system", "node", "node1", "cpulist"))
		if slices.Equal(node1, all) {
			t.Fatalf("the simulated NUMA node 1 has every CPU (%v)", all)
		}
		createPod(t, c, withClaim(probePod("numa-gpu", status), "numa1-gpu"))
		if got := cpusAllowed(t, podOutput(t, c, "numa-gpu")); !slices.Equal(got, node1) {
			t.Errorf("the GPU pod's CPUs: %v, want NUMA node 1's %v", got, node1)
		}
		createPod(t, c, probePod("numa-plain", status))
		if got := cpusAllowed(t, podOutput(t, c, "numa-plain")); !slices.Equal(got, all) {
			t.Errorf("a pod without a GPU runs on %v, want every CPU %v", got, all)
		}
		deletePod(t, c, "numa-gpu")
		deletePod(t, c, "numa-plain")
	})
	t.Run("none", func(t *testing.T) {
		startPlugin(t, c, "dgx1-volta", "--device-plugin=false", "--nri-policy=none")
		until(t, "the slice's 8 GPUs", func() bool { return len(sliceDevices(t, c)) == 8 })
		createPod(t, c, withClaim(probePod("none-gpu", status), "numa1-gpu"))
		if got := cpusAllowed(t, podOutput(t, c, "none-gpu")); !slices.Equal(got, all) {
			t.Errorf("with policy none the GPU pod runs on %v, want every CPU %v", got, all)
		}
	})
}
