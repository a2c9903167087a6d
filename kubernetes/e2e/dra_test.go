package e2e

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuiso/gpuiso/kubernetes/internal/cluster"
)

// ensureClasses makes the README's device classes, once.
func ensureClasses(t *testing.T, c *cluster.Cluster) {
	t.Helper()
	for name, typ := range map[string]string{"gpu.gpuiso.io": "gpu", "mig.gpuiso.io": "mig"} {
		dc := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: resourceapi.DeviceClassSpec{
			Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
				Expression: `device.driver == "gpu.gpuiso.io" && device.attributes["gpu.gpuiso.io"].type == "` + typ + `"`,
			}}},
		}}
		if _, err := c.Client.ResourceV1().DeviceClasses().Create(t.Context(), dc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
}

// claimTemplate makes a ResourceClaimTemplate of one request for count
// devices of class (every device with count 0), with CEL selectors and the
// constraint that they share attribute match ("" for none); it is removed
// when t ends.
func claimTemplate(t *testing.T, c *cluster.Cluster, name, class string, count int64, match string, cel ...string) {
	t.Helper()
	req := &resourceapi.ExactDeviceRequest{DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count}
	if count == 0 {
		req.AllocationMode, req.Count = resourceapi.DeviceAllocationModeAll, 0
	}
	for _, e := range cel {
		req.Selectors = append(req.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: e}})
	}
	tmpl := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}}
	tmpl.Spec.Spec.Devices.Requests = []resourceapi.DeviceRequest{{Name: "gpus", Exactly: req}}
	if match != "" {
		q := resourceapi.FullyQualifiedName(match)
		tmpl.Spec.Spec.Devices.Constraints = []resourceapi.DeviceConstraint{{Requests: []string{"gpus"}, MatchAttribute: &q}}
	}
	if _, err := c.Client.ResourceV1().ResourceClaimTemplates("default").Create(t.Context(), tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Client.ResourceV1().ResourceClaimTemplates("default").Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

// published is a device of the node's slice.
type published struct {
	uuid, clique string
	minor        int
}

// sliceByName is the node's slice, by device name.
func sliceByName(t *testing.T, c *cluster.Cluster) map[string]published {
	t.Helper()
	l, err := c.Client.ResourceV1().ResourceSlices().List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]published{}
	for _, s := range l.Items {
		if s.Spec.Driver != driver {
			continue
		}
		for _, d := range s.Spec.Devices {
			a := func(k string) resourceapi.DeviceAttribute { return d.Attributes[resourceapi.QualifiedName(k)] }
			p := published{}
			if v := a("uuid").StringValue; v != nil {
				p.uuid = *v
			}
			if v := a("nvlinkClique").StringValue; v != nil {
				p.clique = *v
			}
			if v := a("minor").IntValue; v != nil {
				p.minor = int(*v)
			}
			out[d.Name] = p
		}
	}
	return out
}

// allocated is what the scheduler allocated to the pod's claim.
func allocated(t *testing.T, c *cluster.Cluster, podName string, slice map[string]published) (names, uuids []string, minors []int) {
	t.Helper()
	claim := claimOf(t, c, podName)
	if claim.Status.Allocation == nil {
		t.Fatalf("claim %s is not allocated", claim.Name)
	}
	for _, r := range claim.Status.Allocation.Devices.Results {
		d, ok := slice[r.Device]
		if !ok {
			t.Fatalf("claim %s: device %s is not in the slice", claim.Name, r.Device)
		}
		names = append(names, r.Device)
		uuids = append(uuids, d.uuid)
		if !slices.Contains(minors, d.minor) {
			minors = append(minors, d.minor)
		}
	}
	return names, uuids, minors
}

// TestDRA serves a simulated DGX-1 (Volta) through the DRA driver alone:
// claims made from templates are allocated by the scheduler from the
// published slice, prepared by the plugin as CDI specs that containerd
// applies, and each pod is checked from inside for exactly its devices: one
// GPU; two of one NVLink clique; seven GPUs beside a lost one, which
// stays in the slice tainted NoExecute; a claim that
// waits (Pending) while another pod holds every GPU and runs when it ends;
// a claim kept over a restart of the plugin and unprepared after it.
func TestDRA(t *testing.T) {
	c := requireCluster(t)
	ensureClasses(t, c)
	p := startPlugin(t, c, "dgx1-volta", "--device-plugin=false")
	inv := p.inventory()
	_, all := minorsOf(inv)
	major := p.major()
	until(t, "the slice's 8 GPUs", func() bool { return len(sliceDevices(t, c)) == 8 })
	slice := sliceByName(t, c)

	t.Run("one GPU", func(t *testing.T) {
		claimTemplate(t, c, "one-gpu", "gpu.gpuiso.io", 1, "")
		createPod(t, c, withClaim(probePod("one", isolationArgs(major, all, false, metadataStep()...)), "one-gpu"))
		out := podOutput(t, c, "one")
		s := parseSeen(out)
		_, uuids, minors := allocated(t, c, "one", slice)
		if len(uuids) != 1 {
			t.Fatalf("allocated %v", uuids)
		}
		s.check(t, all, minors, uuids)
		checkMetadata(t, out, inv, uuids)
	})

	t.Run("two connected GPUs", func(t *testing.T) {
		// Three GPUs are held first, so that a pair taken without the
		// constraint could span both NVLink cliques.
		claimTemplate(t, c, "three-gpus", "gpu.gpuiso.io", 3, "", `device.attributes["gpu.gpuiso.io"].nvlinkClique == "clique-0"`)
		claimTemplate(t, c, "two-connected", "gpu.gpuiso.io", 2, "gpu.gpuiso.io/nvlinkClique")
		createPod(t, c, withClaim(probePod("three", isolationArgs(major, all, true)), "three-gpus"))
		podOutput(t, c, "three")
		createPod(t, c, withClaim(probePod("pair", isolationArgs(major, all, false)), "two-connected"))
		s := parseSeen(podOutput(t, c, "pair"))
		names, uuids, minors := allocated(t, c, "pair", slice)
		held, _, _ := allocated(t, c, "three", slice)
		t.Logf("held %v, the connected pair %v", held, names)
		if len(names) != 2 || slice[names[0]].clique != slice[names[1]].clique || slice[names[0]].clique == "" {
			t.Errorf("the pair %v is not in one NVLink clique: %+v, %+v", names, slice[names[0]], slice[names[1]])
		}
		s.check(t, all, minors, uuids)
	})

	t.Run("lost GPU", func(t *testing.T) {
		// A lost GPU stays in the slice with a NoExecute taint: a
		// claim that does not tolerate it is never allocated it.
		lost := inv.Devices[5]
		name := ""
		for n, d := range slice {
			if d.uuid == lost.UUID {
				name = n
			}
		}
		markHealth(t, p, inv, lost.UUID, "xid 79")
		defer markHealth(t, p, inv, lost.UUID, "")
		until(t, "the lost GPU tainted in the slice", func() bool {
			return tainted(sliceTaints(t, c)[name], "xid-79", resourceapi.DeviceTaintEffectNoExecute)
		})
		if n := len(sliceDevices(t, c)); n != 8 {
			t.Errorf("%d devices published, want 8 (the lost one tainted)", n)
		}
		// A claim for seven GPUs gets the seven others.
		claimTemplate(t, c, "seven-gpus", "gpu.gpuiso.io", 7, "")
		createPod(t, c, withClaim(probePod("seven", isolationArgs(major, all, false)), "seven-gpus"))
		s := parseSeen(podOutput(t, c, "seven"))
		_, uuids, minors := allocated(t, c, "seven", slice)
		if len(uuids) != 7 || slices.Contains(minors, lost.Minor) {
			t.Errorf("a claim for seven GPUs got minors %v (GPU %d is lost)", minors, lost.Minor)
		}
		s.check(t, all, minors, uuids)
	})

	t.Run("waits for a free GPU", func(t *testing.T) {
		until(t, "the lost GPU's taint to go", func() bool {
			return !slices.ContainsFunc(slices.Collect(maps.Values(sliceTaints(t, c))), func(ts []resourceapi.DeviceTaint) bool { return len(ts) > 0 })
		})
		claimTemplate(t, c, "all-gpus", "gpu.gpuiso.io", 0, "")
		claimTemplate(t, c, "one-gpu-w", "gpu.gpuiso.io", 1, "")
		createPod(t, c, withClaim(probePod("holder", isolationArgs(major, all, true)), "all-gpus"))
		podOutput(t, c, "holder")
		createPod(t, c, withClaim(probePod("waiter", isolationArgs(major, all, false)), "one-gpu-w"))
		until(t, "waiter to be unschedulable", func() bool { return unschedulable(pod(t, c, "waiter")) })
		if ph := pod(t, c, "waiter").Status.Phase; ph != corev1.PodPending {
			t.Fatalf("waiter is %s while every GPU is held", ph)
		}
		deletePod(t, c, "holder")
		s := parseSeen(podOutput(t, c, "waiter"))
		_, uuids, minors := allocated(t, c, "waiter", slice)
		s.check(t, all, minors, uuids)
	})

	t.Run("plugin restart", func(t *testing.T) {
		claimTemplate(t, c, "one-gpu-r", "gpu.gpuiso.io", 1, "")
		createPod(t, c, withClaim(probePod("kept", isolationArgs(major, all, true)), "one-gpu-r"))
		s := parseSeen(podOutput(t, c, "kept"))
		_, uuids, minors := allocated(t, c, "kept", slice)
		s.check(t, all, minors, uuids)
		uid := string(claimOf(t, c, "kept").UID)
		spec := filepath.Join(c.CDIDir, driver+"-claim_alloc-claim-"+uid+".json")
		checkpoint := filepath.Join(p.stateDir, "claims", uid+".json")
		for _, f := range []string{spec, checkpoint} {
			if _, err := os.Stat(f); err != nil {
				t.Fatalf("prepared claim: %v", err)
			}
		}

		p.stop()
		p.start()
		until(t, "the restarted plugin to find the prepared claim", func() bool { return strings.Contains(p.log.String(), "prepared claims kept") })
		kept := pod(t, c, "kept")
		if kept.Status.Phase != corev1.PodRunning || kept.Status.ContainerStatuses[0].RestartCount != 0 {
			t.Errorf("after the restart the pod is %s, %d restarts", kept.Status.Phase, kept.Status.ContainerStatuses[0].RestartCount)
		}
		for _, f := range []string{spec, checkpoint} {
			if _, err := os.Stat(f); err != nil {
				t.Errorf("after the restart: %v", err)
			}
		}
		// Inside the same container, the GPU is still the only one it
		// may open.
		out, err := c.Kubectl(t.Context(), append([]string{"exec", "kept", "--", "/probe"}, isolationArgs(major, all, false)...)...)
		if err != nil {
			t.Fatal(err)
		}
		after := parseSeen(out)
		after.check(t, all, minors, uuids)
		// The claim is unprepared after the restart: its CDI spec and
		// checkpoint go.
		deletePod(t, c, "kept")
		until(t, "the claim's CDI spec and checkpoint to go", func() bool {
			_, err1 := os.Stat(spec)
			_, err2 := os.Stat(checkpoint)
			return os.IsNotExist(err1) && os.IsNotExist(err2)
		})
	})
}

// TestDRAMIG serves a simulated HGX H100 with MIG through the DRA driver: a
// claim for a 1g.10gb MIG device gets one, and its pod may open its parent
// GPU's node and no other GPU, with the MIG device named in its
// environment.
func TestDRAMIG(t *testing.T) {
	c := requireCluster(t)
	ensureClasses(t, c)
	p := startPlugin(t, c, "hgx-h100-mig", "--device-plugin=false")
	inv := p.inventory()
	_, all := minorsOf(inv)
	major := p.major()
	until(t, "the slice's 19 devices", func() bool { return len(sliceDevices(t, c)) == 19 })
	slice := sliceByName(t, c)

	claimTemplate(t, c, "mig-1g-10gb", "mig.gpuiso.io", 1, "", `device.attributes["gpu.gpuiso.io"].profile == "1g.10gb"`)
	createPod(t, c, withClaim(probePod("mig", isolationArgs(major, all, false, "ls", "/dev/nvidia-caps")), "mig-1g-10gb"))
	out := podOutput(t, c, "mig")
	s := parseSeen(out)
	names, uuids, minors := allocated(t, c, "mig", slice)
	t.Logf("allocated %v (%v), the parent's minor %v", names, uuids, minors)
	if len(names) != 1 || !strings.HasPrefix(names[0], "mig-") || !strings.HasPrefix(uuids[0], "MIG-") {
		t.Fatalf("allocated %v %v", names, uuids)
	}
	s.check(t, all, minors, uuids)
	if !strings.Contains(out, "nvidia-cap") {
		t.Errorf("no MIG capability node in the pod's /dev/nvidia-caps:\n%s", out)
	}
}
