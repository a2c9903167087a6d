package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuiso/gpuiso/kubernetes/internal/cluster"
)

// TestDRADynamicMIG serves a simulated HGX H100 whose GPU 0 has MIG
// enabled and no instance, with --dynamic-mig: the slice publishes GPU 0's
// memory and compute slices as counters and every placement of every
// profile, and the GPU whole, as devices that consume them. A claim for a
// 1g.10gb on GPU 0 gets a MIG device made for it: its pod sees the MIG
// device in its environment and its parent GPU's node alone, and the
// instance's capability nodes. While it exists a claim for GPU 0 whole
// stays unschedulable; when the pod goes, the instance is destroyed and
// the whole GPU is allocated. A restart of the plugin in between keeps
// the MIG device.
func TestDRADynamicMIG(t *testing.T) {
	c := requireCluster(t)
	ensureClasses(t, c)
	p := startPlugin(t, c, "hgx-h100-dynmig", "--device-plugin=false", "--dynamic-mig")
	inv := p.inventory()
	_, all := minorsOf(inv)
	major := p.major()
	gpu0 := inv.Devices[0]
	// GPUs 2-7 whole; GPU 0: 25 placements and the GPU; GPU 1: its
	// user's 3g.40gb and the 10 placements beside it.
	// The pool's slices are written one by one: the devices may be in
	// the API before the counter sets they consume.
	var sets string
	until(t, "the partitioned slice's 43 devices and GPU 0's and 1's counter sets", func() bool {
		sets = counterSets(t, c)
		return len(sliceDevices(t, c)) == 43 && strings.Contains(sets, "gpu-0:10") && strings.Contains(sets, "gpu-1:6")
	})
	caps := filepath.Join(p.devRoot, "proc", "driver", "nvidia", "capabilities", fmt.Sprintf("gpu%d", gpu0.Minor), "mig", "gi*")
	instances := func() int {
		m, _ := filepath.Glob(caps)
		return len(m)
	}
	if n := instances(); n != 0 {
		t.Fatalf("GPU 0 has %d instances before any claim", n)
	}

	onGPU0 := `device.attributes["gpu.gpuiso.io"].parentUUID == "` + gpu0.UUID + `"`
	claimTemplate(t, c, "dynmig-1g", "mig.gpuiso.io", 1, "", `device.attributes["gpu.gpuiso.io"].profile == "1g.10gb"`, onGPU0)
	claimTemplate(t, c, "dynmig-whole", "gpu.gpuiso.io", 1, "", `device.attributes["gpu.gpuiso.io"].uuid == "`+gpu0.UUID+`"`)
	createPod(t, c, withClaim(probePod("dynmig", isolationArgs(major, all, true, "ls", "/dev/nvidia-caps")), "dynmig-1g"))
	out := podOutput(t, c, "dynmig")
	s := parseSeen(out)
	claim := claimOf(t, c, "dynmig")
	res := claim.Status.Allocation.Devices.Results
	if len(res) != 1 || !strings.HasPrefix(res[0].Device, "mig-0-1g-10gb-") {
		t.Fatalf("allocated %+v", res)
	}
	mig := s.env["NVIDIA_VISIBLE_DEVICES"]
	t.Logf("allocated %s, made %s", res[0].Device, mig)
	if !strings.HasPrefix(mig, "MIG-") || strings.Contains(mig, ",") {
		t.Fatalf("NVIDIA_VISIBLE_DEVICES=%q", mig)
	}
	s.check(t, all, []int{int(gpu0.Minor)}, []string{mig})
	if !strings.Contains(out, "nvidia-cap") {
		t.Errorf("no MIG capability node in the pod's /dev/nvidia-caps:\n%s", out)
	}
	checkpoint := filepath.Join(p.stateDir, "claims", string(claim.UID)+".json")
	if b, err := os.ReadFile(checkpoint); err != nil || !strings.Contains(string(b), mig) {
		t.Errorf("the claim's checkpoint does not record %s: %v\n%s", mig, err, b)
	}
	if n := instances(); n != 1 {
		t.Errorf("GPU 0 has %d instances with the claim's", n)
	}

	// A restart of the plugin keeps the claim's MIG device, which the pod
	// still reaches alone.
	p.stop()
	p.start()
	until(t, "the restarted plugin to find the prepared claim", func() bool { return strings.Contains(p.log.String(), "prepared claims kept") })
	if strings.Contains(p.log.String(), "restore the CDI specs of prepared claims") {
		t.Errorf("the restart did not restore the claim:\n%s", tail(p.log.String(), 2000))
	}
	if n := instances(); n != 1 {
		t.Errorf("GPU 0 has %d instances after the restart", n)
	}
	again, err := c.Kubectl(t.Context(), append([]string{"exec", "dynmig", "--", "/probe"}, isolationArgs(major, all, false)...)...)
	if err != nil {
		t.Fatal(err)
	}
	parseSeen(again).check(t, all, []int{int(gpu0.Minor)}, []string{mig})
	until(t, "the restarted plugin's slice", func() bool { return len(sliceDevices(t, c)) == 43 })

	// The whole GPU waits while its MIG device exists.
	createPod(t, c, withClaim(probePod("dynmig-whole", isolationArgs(major, all, false)), "dynmig-whole"))
	until(t, "dynmig-whole to be unschedulable", func() bool { return unschedulable(pod(t, c, "dynmig-whole")) })

	deletePod(t, c, "dynmig")
	until(t, "the MIG device to be destroyed", func() bool {
		_, err := os.Stat(checkpoint)
		return instances() == 0 && os.IsNotExist(err)
	})
	whole := parseSeen(podOutput(t, c, "dynmig-whole"))
	whole.check(t, all, []int{int(gpu0.Minor)}, []string{gpu0.UUID})
	if n := instances(); n != 0 {
		t.Errorf("GPU 0 has %d instances while held whole", n)
	}
}

// counterSets lists the driver's counter sets of the node as
// "<name>:<counters>", sorted by slice.
func counterSets(t *testing.T, c *cluster.Cluster) string {
	t.Helper()
	l, err := c.Client.ResourceV1().ResourceSlices().List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, s := range l.Items {
		if s.Spec.Driver != driver {
			continue
		}
		for _, cs := range s.Spec.SharedCounters {
			out = append(out, fmt.Sprintf("%s:%d", cs.Name, len(cs.Counters)))
		}
	}
	return strings.Join(out, " ")
}
