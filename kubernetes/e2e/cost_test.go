package e2e

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/gpuiso/gpuiso/kubernetes/internal/cluster"
)

// phases are the times from a pod's creation to the watches seeing its
// claim made from its template (by the controller manager), the claim
// allocated (by the scheduler), the pod bound to the node, and the pod
// Running (the kubelet's part: its claims prepared, its sandbox and
// container started). A pod without a claim has no claim phases.
type phases struct{ claimed, allocated, bound, running time.Duration }

// startPhases creates the pod and times its phases.
func startPhases(t *testing.T, c *cluster.Cluster, p *corev1.Pod) phases {
	t.Helper()
	w, err := c.Client.CoreV1().Pods("default").Watch(t.Context(), metav1.ListOptions{FieldSelector: "metadata.name=" + p.Name})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	claims := make(<-chan watch.Event)
	if len(p.Spec.ResourceClaims) > 0 {
		cw, err := c.Client.ResourceV1().ResourceClaims("default").Watch(t.Context(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer cw.Stop()
		claims = cw.ResultChan()
	}
	start := time.Now()
	createPod(t, c, p)
	guard := time.After(2 * time.Minute)
	var ph phases
	for {
		select {
		case ev := <-claims:
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
			if strings.HasPrefix(claim.Name, "claim-") { // the pods claim-<i>'s
				return false
			}
		}
		return scrapeMetrics(t, addr)["gpuiso_claims_prepared"] == 0
	})
}

// TestCost measures, and only logs: a pod's start (creation to Running)
// with a DRA claim for one GPU and without (paired runs taken in
// alternating order, each once the runs before are torn down: the median
// of each and of the pairs' ratios, and each kind's time to bound and
// from bound to Running), the plugin's prepare latency (its metrics), the
// plugin's memory, and the time from the plugin's start to a 16-GPU node's
// ResourceSlice in the API.
func TestCost(t *testing.T) {
	c := requireCluster(t)
	if testing.Short() {
		t.Skip("measurements: not in -short")
	}
	ensureClasses(t, c)
	addr := freeAddr(t)
	p := startPlugin(t, c, "dgx1-volta", "--device-plugin=false", "--metrics-address", addr)
	until(t, "the slice's 8 GPUs", func() bool { return len(sliceDevices(t, c)) == 8 })
	claimTemplate(t, c, "cost-gpu", "gpu.gpuiso.io", 1, "")

	const n = 10
	var plain, claimed []phases
	for i := range n {
		without := probePod(fmt.Sprintf("plain-%d", i), []string{"sleep", "100000"})
		with := withClaim(probePod(fmt.Sprintf("claim-%d", i), []string{"sleep", "100000"}), "cost-gpu")
		settled(t, c, addr)
		if i%2 == 0 {
			plain = append(plain, startPhases(t, c, without))
			claimed = append(claimed, startPhases(t, c, with))
		} else {
			claimed = append(claimed, startPhases(t, c, with))
			plain = append(plain, startPhases(t, c, without))
		}
		deletePod(t, c, without.Name)
		deletePod(t, c, with.Name)
	}
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
	var ratios []float64
	for i := range plain {
		ratios = append(ratios, float64(claimed[i].running)/float64(plain[i].running))
	}
	slices.Sort(ratios)
	t.Logf("pod start, creation to Running, median of %d paired runs: without a GPU %v, with a DRA claim for one GPU %v; median of the pairs' ratios %.2f (runs: %v / %v)",
		n, median(pick(plain, running)), median(pick(claimed, running)), (ratios[(n-1)/2]+ratios[n/2])/2, pick(plain, running), pick(claimed, running))
	t.Logf("of which creation to bound (scheduled): without %v, with %v (the claim made from its template after %v, allocated after %v); bound to Running (the kubelet): without %v, with %v",
		median(pick(plain, bound)), median(pick(claimed, bound)), median(pick(claimed, func(p phases) time.Duration { return p.claimed })),
		median(pick(claimed, func(p phases) time.Duration { return p.allocated })), median(pick(plain, kubelet)), median(pick(claimed, kubelet)))
	m := scrapeMetrics(t, addr)
	op := func(name, labels string) float64 { return m[name+"{"+labels+"}"] }
	count := op("gpuiso_dra_operation_duration_seconds_count", `op="prepare"`)
	if count < n {
		t.Errorf("the plugin counted %v prepares, want %d", count, n)
	} else {
		step := func(s string) float64 {
			return 1000 * op("gpuiso_dra_operation_step_duration_seconds_sum", `op="prepare",step="`+s+`"`) / count
		}
		t.Logf("the plugin's prepare, mean of %v: %.2f ms (started %.2f, allocate %.2f, spec %.2f, completed %.2f); unprepare %.2f ms", count,
			1000*op("gpuiso_dra_operation_duration_seconds_sum", `op="prepare"`)/count, step("started"), step("allocate"), step("spec"), step("completed"),
			1000*op("gpuiso_dra_operation_duration_seconds_sum", `op="unprepare"`)/op("gpuiso_dra_operation_duration_seconds_count", `op="unprepare"`))
	}
	rss, hwm := p.rss()
	t.Logf("plugin memory (dgx1-volta, DRA, after %d claims): VmRSS %d KiB, VmHWM %d KiB", n, rss, hwm)
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
