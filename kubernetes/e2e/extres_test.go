package e2e

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/kubernetes/internal/cluster"
)

// extResClass is the DeviceClass of whole GPUs serving nvidia.com/gpu
// through DRA that this file's test makes (as the chart's gpu.gpuiso.io
// does), and adminNS the namespace of its admin-access claims.
const (
	extResClass = "extres.gpuiso.io"
	adminNS     = "xr-admin"
)

// extResSetup makes the class serving nvidia.com/gpu and the namespace
// where admin access is allowed; both go when t ends.
func extResSetup(t *testing.T, c *cluster.Cluster) {
	t.Helper()
	dc := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: extResClass}, Spec: resourceapi.DeviceClassSpec{
		Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: `device.driver == "gpu.gpuiso.io" && device.attributes["gpu.gpuiso.io"].type == "gpu"`,
		}}},
		ExtendedResourceName: ptr.To(gpuResource),
	}}
	if _, err := c.Client.ResourceV1().DeviceClasses().Create(t.Context(), dc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Client.ResourceV1().DeviceClasses().Delete(context.Background(), extResClass, metav1.DeleteOptions{})
	})
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: adminNS, Labels: map[string]string{"resource.kubernetes.io/admin-access": "true"}}}
	if _, err := c.Client.CoreV1().Namespaces().Create(t.Context(), ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	until(t, "namespace "+adminNS+"'s default ServiceAccount", func() bool {
		_, err := c.Client.CoreV1().ServiceAccounts(adminNS).Get(t.Context(), "default", metav1.GetOptions{})
		return err == nil
	})
	t.Cleanup(func() {
		c.Client.CoreV1().Namespaces().Delete(context.Background(), adminNS, metav1.DeleteOptions{})
		until(t, "namespace "+adminNS+" to go", func() bool {
			_, err := c.Client.CoreV1().Namespaces().Get(context.Background(), adminNS, metav1.GetOptions{})
			return apierrors.IsNotFound(err)
		})
	})
}

// sliceOrder is the names of the driver's devices in its slice's order.
func sliceOrder(t *testing.T, c *cluster.Cluster) []string {
	t.Helper()
	l, err := c.Client.ResourceV1().ResourceSlices().List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, s := range l.Items {
		if s.Spec.Driver == driver {
			for _, d := range s.Spec.Devices {
				out = append(out, d.Name)
			}
		}
	}
	return out
}

// configTemplate makes a ResourceClaimTemplate of one GPU of class
// gpu.gpuiso.io whose claim gives the driver params as its opaque
// configuration; it goes when t ends.
func configTemplate(t *testing.T, c *cluster.Cluster, name, params string) {
	t.Helper()
	tmpl := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}}
	tmpl.Spec.Spec.Devices.Requests = []resourceapi.DeviceRequest{{Name: "gpus", Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: "gpu.gpuiso.io", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}}}
	tmpl.Spec.Spec.Devices.Config = []resourceapi.DeviceClaimConfiguration{{Requests: []string{"gpus"},
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver: driver, Parameters: runtime.RawExtension{Raw: []byte(params)}}}}}
	if _, err := c.Client.ResourceV1().ResourceClaimTemplates("default").Create(t.Context(), tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Client.ResourceV1().ResourceClaimTemplates("default").Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

// TestExtResAdminConfig serves a simulated DGX-1 with the program's
// defaults given credentials (DRA only: no device plugin) and checks from
// inside the pods: a pod's resources.limits of nvidia.com/gpu: 2, served
// through a DeviceClass's extendedResourceName, gets two NVLinked GPUs
// while three GPUs of one clique are held (the claim the scheduler writes
// has no constraint: the slice's order makes its first fit a pair); an
// admin claim of a GPU another pod holds sees that GPU, and the allocator
// holds it for its owner only; a claim whose opaque GPUConfig is bad
// fails to prepare with an event of the pod naming the fault.
func TestExtResAdminConfig(t *testing.T) {
	c := requireCluster(t)
	ensureClasses(t, c)
	extResSetup(t, c)
	p := startPlugin(t, c, "dgx1-volta")
	inv := p.inventory()
	_, all := minorsOf(inv)
	major := p.major()
	until(t, "the slice's 8 GPUs", func() bool { return len(sliceDevices(t, c)) == 8 })
	if got := allocatable(t, c, gpuResource); got > 0 {
		t.Fatalf("the node has %d %s allocatable: the device plugin serves it beside DRA", got, gpuResource)
	}
	slice := sliceByName(t, c)

	// GPUs 0-2 of clique 0 are held, so that the first two free GPUs in
	// index order (3 and 4) span both cliques.
	claimTemplate(t, c, "xr-three", "gpu.gpuiso.io", 3, "", `device.attributes["gpu.gpuiso.io"].index < 3`)
	createPod(t, c, withClaim(probePod("xr-three", isolationArgs(major, all, true)), "xr-three"))
	podOutput(t, c, "xr-three")
	held, _, _ := allocated(t, c, "xr-three", slice)

	t.Run("nvidia.com/gpu: 2 is an NVLinked pair", func(t *testing.T) {
		until(t, "the slice to list the free clique first", func() bool {
			o := sliceOrder(t, c)
			return len(o) == 8 && slice[o[0]].clique != slice[held[0]].clique
		})
		t.Logf("held %v; the slice's order %v", held, sliceOrder(t, c))
		createPod(t, c, withGPUs(probePod("xr-pair", isolationArgs(major, all, false)), gpuResource, 2))
		s := parseSeen(podOutput(t, c, "xr-pair"))
		pd := pod(t, c, "xr-pair")
		if pd.Status.ExtendedResourceClaimStatus == nil {
			t.Fatalf("the pod has no extended resource claim: %+v", pd.Status)
		}
		claim, err := c.Client.ResourceV1().ResourceClaims("default").Get(t.Context(), pd.Status.ExtendedResourceClaimStatus.ResourceClaimName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var names, uuids []string
		var minors []int
		for _, r := range claim.Status.Allocation.Devices.Results {
			names = append(names, r.Device)
			uuids = append(uuids, slice[r.Device].uuid)
			minors = append(minors, slice[r.Device].minor)
		}
		t.Logf("the scheduler's claim %s: %d requests, constraints %v; allocated %v", claim.Name,
			len(claim.Spec.Devices.Requests), claim.Spec.Devices.Constraints, names)
		if len(names) != 2 || slice[names[0]].clique == "" || slice[names[0]].clique != slice[names[1]].clique {
			t.Errorf("nvidia.com/gpu: 2 got %v, not two GPUs of one NVLink clique (%+v, %+v)", names, slice[names[0]], slice[names[len(names)-1]])
		}
		s.check(t, all, minors, uuids)
	})

	t.Run("admin claim of a busy GPU", func(t *testing.T) {
		busy := held[0]
		tmpl := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: "xr-watch", Namespace: adminNS}}
		tmpl.Spec.Spec.Devices.Requests = []resourceapi.DeviceRequest{{Name: "gpus", Exactly: &resourceapi.ExactDeviceRequest{
			DeviceClassName: "gpu.gpuiso.io", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1, AdminAccess: ptr.To(true),
			Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
				Expression: `device.attributes["gpu.gpuiso.io"].uuid == "` + slice[busy].uuid + `"`}}},
		}}}
		if _, err := c.Client.ResourceV1().ResourceClaimTemplates(adminNS).Create(t.Context(), tmpl, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		createIn(t, c, in(adminNS, withClaim(probePod("xr-watch", isolationArgs(major, all, true)), "xr-watch")))
		s := probeOf(t, c, adminNS, "xr-watch")
		s.check(t, all, []int{slice[busy].minor}, []string{slice[busy].uuid})

		// The allocator holds the GPU for its owner's claim only.
		a, err := allocator.New(inv, allocator.WithStateDir(filepath.Join(p.stateDir, "allocator")))
		if err != nil {
			t.Fatal(err)
		}
		owner := "claim-" + string(claimOf(t, c, "xr-three").UID)
		for _, al := range a.Allocations() {
			for _, r := range al.Devices {
				if r.UUID == slice[busy].uuid && al.Owner != owner {
					t.Errorf("the allocator holds %s (%s) for %s, want %s", busy, r.UUID, al.Owner, owner)
				}
			}
		}
		a.Close()
		deleteIn(t, c, adminNS, "xr-watch")
		// The owner's pod runs on, its GPU still its own: inside it,
		// still exactly its three GPUs.
		out, err := c.Kubectl(t.Context(), append([]string{"exec", "xr-three", "--", "/probe"}, isolationArgs(major, all, false)...)...)
		if err != nil {
			t.Fatal(err)
		}
		_, uuids, minors := allocated(t, c, "xr-three", slice)
		parseSeen(out).check(t, all, minors, uuids)
	})

	t.Run("bad opaque configuration", func(t *testing.T) {
		for _, tt := range []struct{ name, params, want string }{
			{"xr-unknown", `{"apiVersion":"gpu.gpuiso.io/v1","kind":"GPUConfig","sharing":{"strategy":"Exclusive","replicas":2}}`,
				`unknown field "sharing.replicas"`},
			{"xr-mps", `{"apiVersion":"gpu.gpuiso.io/v1","kind":"GPUConfig","sharing":{"strategy":"MPS"}}`,
				"sharing.strategy: MPS needs a memory share"},
		} {
			configTemplate(t, c, tt.name, tt.params)
			createPod(t, c, withClaim(probePod(tt.name, isolationArgs(major, all, false)), tt.name))
			var msg string
			until(t, "an event of pod "+tt.name+" naming its configuration's fault", func() bool {
				evs, err := c.Client.CoreV1().Events("default").List(t.Context(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + tt.name})
				if err != nil {
					t.Fatal(err)
				}
				for _, e := range evs.Items {
					if strings.Contains(e.Message, tt.want) {
						msg = e.Reason + ": " + e.Message
						return true
					}
				}
				return false
			})
			t.Logf("%s", msg)
			if ph := pod(t, c, tt.name).Status.Phase; ph != corev1.PodPending {
				t.Errorf("pod %s is %s with a bad configuration", tt.name, ph)
			}
			deletePod(t, c, tt.name)
		}
	})
}
