package e2e

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/kubernetes/internal/cluster"
	"github.com/gpuiso/gpuiso/node"
)

// taintKey is the key of the driver's health taints.
const taintKey = driver + "/unhealthy"

// sliceTaints are the taints of the node's published devices, by device
// name: every device is a key, with nil for none.
func sliceTaints(t *testing.T, c *cluster.Cluster) map[string][]resourceapi.DeviceTaint {
	t.Helper()
	l, err := c.Client.ResourceV1().ResourceSlices().List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]resourceapi.DeviceTaint{}
	for _, s := range l.Items {
		if s.Spec.Driver != driver || s.Spec.NodeName == nil || *s.Spec.NodeName != cluster.NodeName {
			continue
		}
		for _, d := range s.Spec.Devices {
			out[d.Name] = d.Taints
		}
	}
	return out
}

// tainted reports whether the device has the driver's health taint of
// value and effect.
func tainted(taints []resourceapi.DeviceTaint, value string, effect resourceapi.DeviceTaintEffect) bool {
	return slices.ContainsFunc(taints, func(x resourceapi.DeviceTaint) bool {
		return x.Key == taintKey && x.Value == value && x.Effect == effect
	})
}

// markHealth marks a GPU of the plugin's node unhealthy with reason (or
// healthy again with ""), through the allocator's state as any process of
// the node may; the plugin reads it within its --health-refresh.
func markHealth(t *testing.T, p *plugin, inv *node.Inventory, uuid, reason string) {
	t.Helper()
	a, err := allocator.New(inv, allocator.WithStateDir(filepath.Join(p.stateDir, "allocator")))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if reason == "" {
		err = a.MarkHealthy(context.Background(), uuid)
	} else {
		_, err = a.MarkUnhealthy(context.Background(), uuid, reason)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// healthTemplate makes a ResourceClaimTemplate of one GPU of uuid whose
// request tolerates the driver's health taints (an operator's diagnostic);
// it is removed when t ends.
func healthTemplate(t *testing.T, c *cluster.Cluster, name, uuid string) {
	t.Helper()
	tmpl := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}}
	tmpl.Spec.Spec.Devices.Requests = []resourceapi.DeviceRequest{{Name: "gpus", Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: "gpu.gpuiso.io", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
		Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.attributes["gpu.gpuiso.io"].uuid == "` + uuid + `"`}}},
		// Both effects named: the eviction controller of 1.37.2 takes
		// only a toleration that names NoExecute as one.
		Tolerations: []resourceapi.DeviceToleration{
			{Key: taintKey, Operator: resourceapi.DeviceTolerationOpExists, Effect: resourceapi.DeviceTaintEffectNoSchedule},
			{Key: taintKey, Operator: resourceapi.DeviceTolerationOpExists, Effect: resourceapi.DeviceTaintEffectNoExecute},
		},
	}}}
	if _, err := c.Client.ResourceV1().ResourceClaimTemplates("default").Create(t.Context(), tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Client.ResourceV1().ResourceClaimTemplates("default").Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

// resourceHealth is the health the pod's status shows of its claim's
// devices (containerStatuses[].allocatedResourcesStatus), by resource id.
func resourceHealth(p *corev1.Pod) map[string]corev1.ResourceHealth {
	out := map[string]corev1.ResourceHealth{}
	for _, cs := range p.Status.ContainerStatuses {
		for _, rs := range cs.AllocatedResourcesStatus {
			if !strings.HasPrefix(string(rs.Name), "claim:") {
				continue
			}
			for _, h := range rs.Resources {
				out[string(h.ResourceID)] = h
			}
		}
	}
	return out
}

// TestDRAHealth: a GPU lost under a running pod (XID 79, "fallen off the
// bus") stays in the slice with a NoExecute taint, the cluster evicts the
// pod, a claim that tolerates the taint still gets the GPU (the pod sees
// exactly it from inside) and its pod's status shows the device
// Unhealthy with the reason; after recovery the taint goes and the status
// shows it Healthy.
func TestDRAHealth(t *testing.T) {
	c := requireCluster(t)
	ensureClasses(t, c)
	p := startPlugin(t, c, "dgx1-volta", "--device-plugin=false")
	inv := p.inventory()
	_, all := minorsOf(inv)
	major := p.major()
	until(t, "the slice's 8 GPUs", func() bool { return len(sliceDevices(t, c)) == 8 })
	slice := sliceByName(t, c)

	claimTemplate(t, c, "health-one", "gpu.gpuiso.io", 1, "")
	createPod(t, c, withClaim(probePod("health-victim", isolationArgs(major, all, true)), "health-one"))
	s := parseSeen(podOutput(t, c, "health-victim"))
	names, uuids, minors := allocated(t, c, "health-victim", slice)
	s.check(t, all, minors, uuids)
	lost, lostUUID := names[0], uuids[0]
	victimUID := pod(t, c, "health-victim").UID

	markHealth(t, p, inv, lostUUID, "XID 79")
	defer markHealth(t, p, inv, lostUUID, "")
	until(t, lost+" tainted NoExecute", func() bool {
		return tainted(sliceTaints(t, c)[lost], "xid-79", resourceapi.DeviceTaintEffectNoExecute)
	})
	if n := len(sliceDevices(t, c)); n != 8 {
		t.Errorf("%d devices in the slice with %s lost, want 8 (it stays, tainted)", n, lost)
	}
	until(t, "the pod on the lost GPU to be evicted", func() bool {
		v, err := c.Client.CoreV1().Pods("default").Get(t.Context(), "health-victim", metav1.GetOptions{})
		return apierrors.IsNotFound(err) || err == nil && (v.UID != victimUID || v.DeletionTimestamp != nil)
	})
	// The device taint eviction controller says so.
	until(t, "the eviction's event", func() bool {
		events, err := c.Client.CoreV1().Events("default").List(t.Context(), metav1.ListOptions{FieldSelector: "involvedObject.name=health-victim"})
		if err != nil {
			t.Fatal(err)
		}
		return slices.ContainsFunc(events.Items, func(e corev1.Event) bool {
			return e.InvolvedObject.UID == victimUID && e.Reason == "DeviceTaintManagerEviction"
		})
	})

	// An operator's diagnostic claim tolerates the taint and gets the
	// lost GPU; the pod sees exactly it.
	healthTemplate(t, c, "health-diag", lostUUID)
	createPod(t, c, withClaim(probePod("health-diag", isolationArgs(major, all, true)), "health-diag"))
	s = parseSeen(podOutput(t, c, "health-diag"))
	_, uuids, minors = allocated(t, c, "health-diag", slice)
	if len(uuids) != 1 || uuids[0] != lostUUID {
		t.Fatalf("the tolerating claim got %v, want the lost %s", uuids, lostUUID)
	}
	s.check(t, all, minors, uuids)
	cdiID := driver + "/claim=alloc-claim-" + string(claimOf(t, c, "health-diag").UID)
	var h corev1.ResourceHealth
	until(t, "the pod's status to show the lost GPU Unhealthy", func() bool {
		h = resourceHealth(pod(t, c, "health-diag"))[cdiID]
		return h.Health == corev1.ResourceHealthStatusUnhealthy
	})
	if h.Message == nil || !strings.Contains(*h.Message, "XID 79") {
		t.Errorf("the lost GPU's health message %v, want the reason XID 79", h.Message)
	}

	markHealth(t, p, inv, lostUUID, "")
	until(t, "the taint to go", func() bool { return len(sliceTaints(t, c)[lost]) == 0 })
	until(t, "the pod's status to show the GPU Healthy", func() bool {
		return resourceHealth(pod(t, c, "health-diag"))[cdiID].Health == corev1.ResourceHealthStatusHealthy
	})
	deletePod(t, c, "health-diag")
}
