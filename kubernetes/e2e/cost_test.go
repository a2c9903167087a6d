package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"

	"github.com/gpuiso/gpuiso/kubernetes/internal/cluster"
)

// phases are the times from a pod's creation to the watches seeing its
// claim (made from its template by the controller manager, or by the
// scheduler for an extended resource; at once for a claim made
// beforehand), the pod's status naming that claim (the controller
// manager's, or the scheduler's for an extended resource), the claim
// allocated (by the scheduler), the pod bound to the node, and the pod
// Running (the kubelet's part: its claims prepared, its sandbox and
// container started). A pod without a claim has no claim phases.
type phases struct{ claimed, named, allocated, bound, running time.Duration }

// startPhases creates the pod and times its phases: its claims are those
// whose names begin with the pod's name and a dash.
func startPhases(t *testing.T, c *cluster.Cluster, p *corev1.Pod) phases {
	t.Helper()
	w, err := c.Client.CoreV1().Pods("default").Watch(t.Context(), metav1.ListOptions{FieldSelector: "metadata.name=" + p.Name})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	// Watched for every pod, the one without a claim too, so that each
	// kind's start pays for the same watches.
	cw, err := c.Client.ResourceV1().ResourceClaims("default").Watch(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer cw.Stop()
	start := time.Now()
	createPod(t, c, p)
	guard := time.After(2 * time.Minute)
	var ph phases
	for {
		select {
		case ev := <-cw.ResultChan():
			claim, ok := ev.Object.(*resourceapi.ResourceClaim)
			if !ok || !strings.HasPrefix(claim.Name, p.Name+"-") {
				continue
			}
			if ph.claimed == 0 {
				ph.claimed = time.Since(start)
			}
			if claim.Status.Allocation != nil && ph.allocated == 0 {
				ph.allocated = time.Since(start)
			}
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatal("the watch ended")
			}
			got, ok := ev.Object.(*corev1.Pod)
			if ok && ph.named == 0 && (len(got.Status.ResourceClaimStatuses) > 0 || got.Status.ExtendedResourceClaimStatus != nil) {
				ph.named = time.Since(start)
			}
			if ok && got.Spec.NodeName != "" && ph.bound == 0 {
				ph.bound = time.Since(start)
			}
			if ok && got.Status.Phase == corev1.PodRunning {
				ph.running = time.Since(start)
				return ph
			}
		case <-guard:
			t.Fatalf("pod %s not Running after 2 minutes", p.Name)
		}
	}
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func medianFloat(fs []float64) float64 {
	s := slices.Clone(fs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// costArms are the kinds of pod TestCost starts, by name prefix: the
// first asks for no GPU, the others for one GPU each.
var costArms = []struct{ prefix, what string }{
	{"plain", "without a GPU"},
	{"claim", "a claim from a ResourceClaimTemplate"},
	{"made", "a ResourceClaim made beforehand"},
	{"xres", "limits nvidia.com/gpu: 1 (DeviceClass extendedResourceName)"},
}

// settled waits until the node has no claim of the pods before: none in
// the API, none prepared by the plugin (its metrics at addr), so that the
// teardown of one run does not slow the next.
func settled(t *testing.T, c *cluster.Cluster, addr string) {
	t.Helper()
	until(t, "the claims of the runs before to be gone", func() bool {
		l, err := c.Client.ResourceV1().ResourceClaims("default").List(t.Context(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, claim := range l.Items {
			for _, a := range costArms[1:] {
				if strings.HasPrefix(claim.Name, a.prefix+"-") {
					return false
				}
			}
		}
		m, err := tryMetrics(t, addr) // the plugin may not listen yet
		return err == nil && m["gpuiso_claims_prepared"] == 0
	})
}

// costClass is the DeviceClass of whole GPUs serving nvidia.com/gpu
// through DRA that TestCost makes.
const costClass = "cost-xres.gpuiso.io"

// deletePods deletes the pods at once and waits until all are gone.
func deletePods(t *testing.T, c *cluster.Cluster, names ...string) {
	t.Helper()
	for _, name := range names {
		err := c.Client.CoreV1().Pods("default").Delete(t.Context(), name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(1))})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
	}
	for _, name := range names {
		deletePod(t, c, name)
	}
}

// TestCost measures, and only logs: a pod's start (creation to Running)
// without a GPU and with one GPU served by the DRA driver three ways (a
// claim made from a ResourceClaimTemplate by the controller manager, a
// ResourceClaim made beforehand, and limits of nvidia.com/gpu served
// through a DeviceClass's extendedResourceName, whose claim the scheduler
// makes), in rounds of one pod of each kind in rotating order, each round
// once the rounds before are torn down: each kind's median, the median of
// its ratios to the pod without a GPU of the same round, and its phases;
// the plugin's prepare latency (its metrics), the plugin's memory, and the
// time from the plugin's start to a 16-GPU node's ResourceSlice in the
// API.
func TestCost(t *testing.T) {
	c := requireCluster(t)
	if testing.Short() {
		t.Skip("measurements: not in -short")
	}
	ensureClasses(t, c)
	dc := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: costClass}, Spec: resourceapi.DeviceClassSpec{
		Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: `device.driver == "gpu.gpuiso.io" && device.attributes["gpu.gpuiso.io"].type == "gpu"`,
		}}},
		ExtendedResourceName: ptr.To(gpuResource),
	}}
	if _, err := c.Client.ResourceV1().DeviceClasses().Create(t.Context(), dc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Client.ResourceV1().DeviceClasses().Delete(context.Background(), costClass, metav1.DeleteOptions{})
	})
	addr := freeAddr(t)
	p := startPlugin(t, c, "dgx1-volta", "--device-plugin=false", "--metrics-address", addr)
	until(t, "the slice's 8 GPUs", func() bool { return len(sliceDevices(t, c)) == 8 })
	// The scheduler serves nvidia.com/gpu through DRA only on a node that
	// has none of it allocatable from a device plugin.
	until(t, "no "+gpuResource+" allocatable from a device plugin", func() bool { return allocatable(t, c, gpuResource) <= 0 })
	claimTemplate(t, c, "cost-gpu", "gpu.gpuiso.io", 1, "")
	tmpl, err := c.Client.ResourceV1().ResourceClaimTemplates("default").Get(t.Context(), "cost-gpu", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	// Eight rounds: each kind of pod is started twice in each place of
	// the rotation.
	const n = 8
	podOf := func(arm, i int) *corev1.Pod {
		a := costArms[arm]
		p := probePod(fmt.Sprintf("%s-%d", a.prefix, i), []string{"sleep", "100000"})
		switch a.prefix {
		case "claim":
			withClaim(p, "cost-gpu")
		case "made":
			p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpus", ResourceClaimName: ptr.To(p.Name + "-gpus")}}
			p.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpus"}}
		case "xres":
			withGPUs(p, gpuResource, 1)
		}
		return p
	}
	runs := make([][]phases, len(costArms))
	for i := range n {
		settled(t, c, addr)
		made := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("made-%d-gpus", i), Namespace: "default"}, Spec: tmpl.Spec.Spec}
		if _, err := c.Client.ResourceV1().ResourceClaims("default").Create(t.Context(), made, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		var names []string
		for k := range costArms {
			arm := (i + k) % len(costArms)
			pd := podOf(arm, i)
			runs[arm] = append(runs[arm], startPhases(t, c, pd))
			names = append(names, pd.Name)
		}
		deletePods(t, c, names...)
		if err := c.Client.ResourceV1().ResourceClaims("default").Delete(t.Context(), made.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
	}
	settled(t, c, addr)
	pick := func(ps []phases, f func(phases) time.Duration) []time.Duration {
		var out []time.Duration
		for _, p := range ps {
			out = append(out, f(p))
		}
		return out
	}
	running := func(p phases) time.Duration { return p.running }
	bound := func(p phases) time.Duration { return p.bound }
	kubelet := func(p phases) time.Duration { return p.running - p.bound }
	plain := runs[0]
	t.Logf("pod start, creation to Running, %d rounds of one pod of each kind (rotating order); %s: median %v, bound after %v, bound to Running (the kubelet) %v (runs %v)",
		n, costArms[0].what, median(pick(plain, running)), median(pick(plain, bound)), median(pick(plain, kubelet)), pick(plain, running))
	for arm := 1; arm < len(costArms); arm++ {
		var ratios []float64
		for i := range plain {
			ratios = append(ratios, float64(runs[arm][i].running)/float64(plain[i].running))
		}
		claimed := ""
		if costArms[arm].prefix != "made" {
			claimed = fmt.Sprintf("claim made after %v, named in the pod's status after %v, ",
				median(pick(runs[arm], func(p phases) time.Duration { return p.claimed })), median(pick(runs[arm], func(p phases) time.Duration { return p.named })))
		}
		t.Logf("%s: median %v, median of the ratios to the pod without %.2f; %sallocated after %v, bound after %v, bound to Running (the kubelet) %v (runs %v)",
			costArms[arm].what, median(pick(runs[arm], running)), medianFloat(ratios), claimed,
			median(pick(runs[arm], func(p phases) time.Duration { return p.allocated })), median(pick(runs[arm], bound)),
			median(pick(runs[arm], kubelet)), pick(runs[arm], running))
	}
	const prepared = 3 * n
	m := scrapeMetrics(t, addr)
	op := func(name, labels string) float64 { return m[name+"{"+labels+"}"] }
	count := op("gpuiso_dra_operation_duration_seconds_count", `op="prepare"`)
	if count < prepared {
		t.Errorf("the plugin counted %v prepares, want %d", count, prepared)
	} else {
		step := func(s string) float64 {
			return 1000 * op("gpuiso_dra_operation_step_duration_seconds_sum", `op="prepare",step="`+s+`"`) / count
		}
		t.Logf("the plugin's prepare, mean of %v: %.2f ms (started %.2f, allocate %.2f, spec %.2f, completed %.2f); unprepare %.2f ms", count,
			1000*op("gpuiso_dra_operation_duration_seconds_sum", `op="prepare"`)/count, step("started"), step("allocate"), step("spec"), step("completed"),
			1000*op("gpuiso_dra_operation_duration_seconds_sum", `op="unprepare"`)/op("gpuiso_dra_operation_duration_seconds_count", `op="unprepare"`))
	}
	rss, hwm := p.rss()
	t.Logf("plugin memory (dgx1-volta, DRA, after %d claims): VmRSS %d KiB, VmHWM %d KiB", prepared, rss, hwm)
	p.stop()

	// A 16-GPU node: from the program's start to its slice in the API.
	w, err := c.Client.ResourceV1().ResourceSlices().Watch(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	start := time.Now()
	p16 := startPlugin(t, c, "dgx2", "--device-plugin=false")
	guard := time.After(2 * time.Minute)
	var took time.Duration
	for took == 0 {
		select {
		case ev := <-w.ResultChan():
			s, ok := ev.Object.(*resourceapi.ResourceSlice)
			if ok && ev.Type != watch.Deleted && s.Spec.Driver == driver && len(s.Spec.Devices) == 16 {
				took = time.Since(start)
			}
		case <-guard:
			t.Fatal("no slice of 16 GPUs after 2 minutes")
		}
	}
	rss, hwm = p16.rss()
	t.Logf("ResourceSlice of 16 GPUs (dgx2): program start to the slice in the API %v; plugin memory VmRSS %d KiB, VmHWM %d KiB", took, rss, hwm)

	p16.stop()
	pBoth := startPlugin(t, c, "dgx2", "--device-plugin", "--extended-resource-name=")
	until(t, "16 allocatable GPUs", func() bool { return allocatable(t, c, gpuResource) == 16 })
	until(t, "the slice of 16 GPUs", func() bool { return len(sliceDevices(t, c)) == 16 })
	rss, hwm = pBoth.rss()
	t.Logf("plugin memory (dgx2, device plugin and DRA driver, both registered): VmRSS %d KiB, VmHWM %d KiB", rss, hwm)
}
