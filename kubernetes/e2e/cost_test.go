package e2e

import (
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/gpuiso/gpuiso/kubernetes/internal/cluster"
)

// startLatency creates the pod and returns the time from its creation to
// the watch reporting it Running.
func startLatency(t *testing.T, c *cluster.Cluster, p *corev1.Pod) time.Duration {
	t.Helper()
	w, err := c.Client.CoreV1().Pods("default").Watch(t.Context(), metav1.ListOptions{FieldSelector: "metadata.name=" + p.Name})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	start := time.Now()
	createPod(t, c, p)
	guard := time.After(2 * time.Minute)
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatal("the watch ended")
			}
			if got, ok := ev.Object.(*corev1.Pod); ok && got.Status.Phase == corev1.PodRunning {
				return time.Since(start)
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

// TestCost measures, and only logs: a pod's start (creation to Running)
// with a DRA claim for one GPU and without (the median of paired runs,
// taken in alternating order), the plugin's memory, and the time from the
// plugin's start to a 16-GPU node's ResourceSlice in the API.
func TestCost(t *testing.T) {
	c := requireCluster(t)
	if testing.Short() {
		t.Skip("measurements: not in -short")
	}
	ensureClasses(t, c)
	p := startPlugin(t, c, "dgx1-volta", "--device-plugin=false")
	until(t, "the slice's 8 GPUs", func() bool { return len(sliceDevices(t, c)) == 8 })
	claimTemplate(t, c, "cost-gpu", "gpu.gpuiso.io", 1, "")

	const n = 10
	var plain, claimed []time.Duration
	for i := range n {
		without := probePod(fmt.Sprintf("plain-%d", i), []string{"sleep", "100000"})
		with := withClaim(probePod(fmt.Sprintf("claim-%d", i), []string{"sleep", "100000"}), "cost-gpu")
		if i%2 == 0 {
			plain = append(plain, startLatency(t, c, without))
			claimed = append(claimed, startLatency(t, c, with))
		} else {
			claimed = append(claimed, startLatency(t, c, with))
			plain = append(plain, startLatency(t, c, without))
		}
		deletePod(t, c, without.Name)
		deletePod(t, c, with.Name)
	}
	t.Logf("pod start, creation to Running, median of %d paired runs: without a GPU %v, with a DRA claim for one GPU %v (runs: %v / %v)",
		n, median(plain), median(claimed), plain, claimed)
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
