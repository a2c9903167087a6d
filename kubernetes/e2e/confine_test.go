package e2e

import (
	"context"
	"strings"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/gpuiso/gpuiso/kubernetes/internal/cluster"
)

// TestPluginConfined installs the chart (its admission policy on, as by
// default) and acts with the plugin's own credentials: a token of its
// service account bound to its pod on the first node, as the pod's
// projected token is. The plugins still label their nodes and publish
// their slices. With the token, its own Node takes a GPU label and its own
// node's slice of its driver is created, updated and deleted; another
// Node, another node's slice (created or updated), a slice of another
// driver, a label or a taint not the driver's are refused by the policy;
// and a token bound to no pod (no node) may write nothing.
func TestPluginConfined(t *testing.T) {
	c := requireCluster(t)
	h := requireHelm(t, c)
	ctx := t.Context()
	image := pluginImage(t)
	archive, err := cluster.PluginImageArchive(image, pluginBin)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.ImportArchive(ctx, nil, image, archive); err != nil {
		t.Fatal(err)
	}
	clearForInstall(t, c)
	values := installValues(t, c, freeMetricsPort(t, c)) // the policy is on by default
	if out, err := h.run(ctx, append([]string{"install", release, chartDir, "--namespace", "default", "--wait", "--timeout", "3m"}, values...)...); err != nil {
		t.Fatalf("%v\n%s\n%s", err, out, c.Logs(2000))
	}
	h.uninstallAtEnd(t, c, nil)
	until(t, "the DaemonSet on every node", func() bool { return daemonSetRolled(t, c) })
	// Under the policy each plugin still labels its Node and publishes
	// its node's slice.
	until(t, "every node's slice", func() bool { return publishedAsWanted(t, c) })
	for _, n := range c.Nodes {
		node, err := c.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if node.Labels["nvidia.com/gpu.product"] == "" {
			t.Errorf("node %s: no GPU label under the policy: %v", n.Name, node.Labels)
		}
	}

	own, other := c.Nodes[0].Name, c.Nodes[1].Name
	p, ok := pluginPods(t, c)[own]
	if !ok {
		t.Fatalf("no plugin pod on %s", own)
	}
	plugin := tokenClient(t, c, &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: p.Name, UID: p.UID})

	patchLabels := func(cs kubernetes.Interface, node, patch string) error {
		_, err := cs.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		return err
	}
	allowed := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Errorf("%s with the plugin's token: %v", what, err)
		}
	}
	refused := func(what string, err error) {
		t.Helper()
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "ValidatingAdmissionPolicy") {
			t.Errorf("%s with the plugin's token: %v, want refused by the admission policy", what, err)
		}
	}

	// Nodes.
	allowed("a GPU label on its own Node", patchLabels(plugin, own, `{"metadata":{"labels":{"nvidia.com/gpu.confined":"yes"}}}`))
	allowed("the GPU label removed from its own Node", patchLabels(plugin, own, `{"metadata":{"labels":{"nvidia.com/gpu.confined":null}}}`))
	refused("a GPU label on another Node", patchLabels(plugin, other, `{"metadata":{"labels":{"nvidia.com/gpu.confined":"yes"}}}`))
	refused("another Node tainted NoExecute", patchLabels(plugin, other, `{"spec":{"taints":[{"key":"gpu.gpuiso.io/evict","effect":"NoExecute"}]}}`))
	refused("another label on its own Node", patchLabels(plugin, own, `{"metadata":{"labels":{"example.com/role":"control-plane"}}}`))
	refused("its own Node's simulated kind changed", patchLabels(plugin, own, `{"metadata":{"labels":{"`+simulateLabel+`":"dgx-a100"}}}`))
	refused("its own Node tainted NoExecute", patchLabels(plugin, own, `{"spec":{"taints":[{"key":"example.com/evict","effect":"NoExecute"}]}}`))
	refused("its own Node made unschedulable", patchLabels(plugin, own, `{"spec":{"unschedulable":true}}`))

	// ResourceSlices.
	slice := func(name, node, driverName string) *resourceapi.ResourceSlice {
		return &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: resourceapi.ResourceSliceSpec{
				Driver:   driverName,
				Pool:     resourceapi.ResourcePool{Name: "confined-" + node, ResourceSliceCount: 1},
				NodeName: ptr.To(node),
				Devices:  []resourceapi.Device{{Name: "forged"}},
			},
		}
	}
	slices := plugin.ResourceV1().ResourceSlices()
	_, err = slices.Create(ctx, slice("confined-other", other, driver), metav1.CreateOptions{})
	refused("a slice for another node", err)
	_, err = slices.Create(ctx, slice("confined-driver", own, "gpu.example.com"), metav1.CreateOptions{})
	refused("a slice of another driver for its own node", err)
	otherSlice := theSlice(t, c, other)
	otherSlice.Labels = map[string]string{"forged": "yes"}
	_, err = slices.Update(ctx, otherSlice, metav1.UpdateOptions{})
	refused("another node's slice updated", err)
	refused("another node's slice deleted", slices.Delete(ctx, otherSlice.Name, metav1.DeleteOptions{}))

	mine, err := slices.Create(ctx, slice("confined-own", own, driver), metav1.CreateOptions{})
	allowed("a slice of its own node and driver", err)
	if err == nil {
		t.Cleanup(func() {
			c.Client.ResourceV1().ResourceSlices().Delete(context.Background(), mine.Name, metav1.DeleteOptions{})
		})
		moved := mine.DeepCopy()
		moved.Spec.Devices = append(moved.Spec.Devices, resourceapi.Device{Name: "forged-too"})
		_, err = slices.Update(ctx, moved, metav1.UpdateOptions{})
		if !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) { // the plugin may have removed a pool it does not know
			allowed("its own slice updated", err)
		}
		if err := slices.Delete(ctx, mine.Name, metav1.DeleteOptions{}); !apierrors.IsNotFound(err) {
			allowed("its own slice deleted", err)
		}
	}

	// A token of the same service account bound to no pod names no
	// node: it may write nothing.
	unbound := tokenClient(t, c, nil)
	refused("a GPU label on its own Node with a token of no pod", patchLabels(unbound, own, `{"metadata":{"labels":{"nvidia.com/gpu.confined":"yes"}}}`))
	_, err = unbound.ResourceV1().ResourceSlices().Create(ctx, slice("confined-unbound", own, driver), metav1.CreateOptions{})
	refused("a slice with a token of no pod", err)
}

// tokenClient is a client with a token of the plugin's service account,
// bound to bound (nil: to nothing), as the TokenRequest API issues it.
func tokenClient(t *testing.T, c *cluster.Cluster, bound *authenticationv1.BoundObjectReference) kubernetes.Interface {
	t.Helper()
	tr, err := c.Client.CoreV1().ServiceAccounts(pluginNS).CreateToken(t.Context(), daemonSet, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{BoundObjectRef: bound, ExpirationSeconds: ptr.To[int64](600)},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	admin, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	rc := rest.AnonymousClientConfig(admin)
	rc.BearerToken = tr.Status.Token
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// theSlice is the driver's slice of node, as published.
func theSlice(t *testing.T, c *cluster.Cluster, node string) *resourceapi.ResourceSlice {
	t.Helper()
	l, err := c.Client.ResourceV1().ResourceSlices().List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range l.Items {
		if s.Spec.Driver == driver && s.Spec.NodeName != nil && *s.Spec.NodeName == node {
			return &s
		}
	}
	t.Fatalf("no slice of %s for node %s", driver, node)
	return nil
}
