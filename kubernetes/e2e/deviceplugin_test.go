package e2e

import (
	"context"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/kubernetes/internal/cluster"
)

func resourceQuantity(n int64) *resource.Quantity { return resource.NewQuantity(n, resource.DecimalSI) }

const gpuResource = "nvidia.com/gpu"

// TestDevicePlugin serves a simulated DGX-1 (Volta, 8 GPUs in an NVLink
// hybrid cube mesh) through the device plugin alone, and checks from
// inside each pod which GPUs it can use:
//   - a pod asking for nvidia.com/gpu: 2 gets a best-connected pair
//     (GetPreferredAllocation), exactly its two nodes, the others denied;
//   - a pod asking for more than is free stays Pending, and runs with all
//     eight when the pair's pod ends;
//   - a GPU marked lost in the allocator's state leaves the Node's
//     allocatable, and a pod asking for all that is left does not get it;
//   - a pod without a GPU request sees no GPU and may open none.
func TestDevicePlugin(t *testing.T) {
	c := requireCluster(t)
	p := startPlugin(t, c, "dgx1-volta", "--dra=false")
	inv := p.inventory()
	byUUID, all := minorsOf(inv)
	major := p.major()
	pos := map[string]int{}
	for i, d := range inv.Devices {
		pos[d.UUID] = i
	}
	until(t, "8 allocatable GPUs", func() bool { return allocatable(t, c, gpuResource) == 8 })

	// uuidsOf are the GPUs a pod's probe names, with their minors.
	uuidsOf := func(s seen) ([]string, []int) {
		var uuids []string
		var minors []int
		for _, u := range strings.Split(s.env["NVIDIA_VISIBLE_DEVICES"], ",") {
			if m, ok := byUUID[u]; ok {
				uuids = append(uuids, u)
				minors = append(minors, m)
			}
		}
		return uuids, minors
	}

	t.Run("best-connected pair", func(t *testing.T) {
		createPod(t, c, withGPUs(probePod("pair", isolationArgs(major, all, true)), gpuResource, 2))
		s := parseSeen(podOutput(t, c, "pair"))
		uuids, minors := uuidsOf(s)
		if len(uuids) != 2 {
			t.Fatalf("NVIDIA_VISIBLE_DEVICES=%q: want 2 of the node's GPUs", s.env["NVIDIA_VISIBLE_DEVICES"])
		}
		s.check(t, all, minors, uuids)
		t.Logf("the pod's pair: minors %v", minors)
		best := -1
		for a := range inv.Devices {
			for b := a + 1; b < len(inv.Devices); b++ {
				best = max(best, inv.Topology.SetScore([]int{a, b}))
			}
		}
		if got := inv.Topology.SetScore([]int{pos[uuids[0]], pos[uuids[1]]}); got != best {
			t.Errorf("the pod's pair %v links with score %d, the best pair %d", minors, got, best)
		}

		// More than is free: Pending until the pair's pod ends.
		createPod(t, c, withGPUs(probePod("all-eight", isolationArgs(major, all, false)), gpuResource, 8))
		until(t, "all-eight to be unschedulable", func() bool { return unschedulable(pod(t, c, "all-eight")) })
		if ph := pod(t, c, "all-eight").Status.Phase; ph != corev1.PodPending {
			t.Fatalf("all-eight is %s while 2 of 8 GPUs are held", ph)
		}
		deletePod(t, c, "pair")
		s = parseSeen(podOutput(t, c, "all-eight"))
		uuids, minors = uuidsOf(s)
		s.check(t, all, all, uuids)
		if len(uuids) != 8 {
			t.Errorf("all-eight got %v", minors)
		}
		deletePod(t, c, "all-eight")
	})

	t.Run("lost GPU", func(t *testing.T) {
		// Another gpuiso program marks GPU 3 lost in the allocator's state;
		// the plugin reads it within --health-refresh.
		lost := inv.Devices[3]
		a, err := allocator.New(inv, allocator.WithStateDir(p.stateDir+"/allocator"))
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		if _, err := a.MarkUnhealthy(t.Context(), lost.UUID, "xid 79"); err != nil {
			t.Fatal(err)
		}
		defer a.MarkHealthy(context.Background(), lost.UUID)
		until(t, "7 allocatable GPUs", func() bool { return allocatable(t, c, gpuResource) == 7 })

		createPod(t, c, withGPUs(probePod("seven", isolationArgs(major, all, false)), gpuResource, 7))
		s := parseSeen(podOutput(t, c, "seven"))
		uuids, minors := uuidsOf(s)
		want := slices.DeleteFunc(slices.Clone(all), func(m int) bool { return m == lost.Minor })
		slices.Sort(minors)
		if !slices.Equal(minors, want) {
			t.Errorf("a pod asking for the 7 healthy GPUs got minors %v, want %v", minors, want)
		}
		s.check(t, all, want, uuids)

		createPod(t, c, withGPUs(probePod("eight", isolationArgs(major, all, false)), gpuResource, 8))
		until(t, "eight to be unschedulable", func() bool { return unschedulable(pod(t, c, "eight")) })
	})

	t.Run("no GPU requested", func(t *testing.T) {
		testNoGPU(t, c, major, all)
	})
}

// testNoGPU runs a pod without a GPU request: it sees no GPU node and its
// own nodes for every minor are denied.
func testNoGPU(t *testing.T, c *cluster.Cluster, major uint32, all []int) {
	createPod(t, c, probePod("no-gpu", isolationArgs(major, all, false)))
	parseSeen(podOutput(t, c, "no-gpu")).check(t, all, nil, nil)
}

// TestDevicePluginMIG serves a simulated HGX H100 with MIG through the
// device plugin: nvidia.com/mig-1g.10gb counts the node's 1g.10gb MIG
// devices, and a pod asking for one gets one, its parent GPU's node alone
// and MIG capability nodes.
func TestDevicePluginMIG(t *testing.T) {
	c := requireCluster(t)
	p := startPlugin(t, c, "hgx-h100-mig", "--dra=false")
	inv := p.inventory()
	_, all := minorsOf(inv)
	major := p.major()
	parent := map[string]int{} // a 1g.10gb MIG device's parent GPU minor
	for _, d := range inv.Devices {
		for _, m := range d.MIGDevices {
			if m.Profile == "1g.10gb" {
				parent[m.UUID] = d.Minor
			}
		}
	}
	const migResource = "nvidia.com/mig-1g.10gb"
	until(t, "the 1g.10gb MIG devices to be allocatable", func() bool { return allocatable(t, c, migResource) == int64(len(parent)) })

	createPod(t, c, withGPUs(probePod("mig", isolationArgs(major, all, false, "ls", "/dev/nvidia-caps")), migResource, 1))
	out := podOutput(t, c, "mig")
	s := parseSeen(out)
	uuid := s.env["NVIDIA_VISIBLE_DEVICES"]
	minor, ok := parent[uuid]
	if !ok {
		t.Fatalf("NVIDIA_VISIBLE_DEVICES=%q: not one of the node's 1g.10gb MIG devices", uuid)
	}
	t.Logf("got %s on GPU minor %d", uuid, minor)
	s.check(t, all, []int{minor}, []string{uuid})
	if !strings.Contains(out, "nvidia-cap") {
		t.Errorf("no MIG capability node in the pod's /dev/nvidia-caps:\n%s", out)
	}
}
