package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"

	"github.com/gpuiso/gpuiso/kubernetes/internal/cluster"
)

// costRounds is how many pairs of batches testClusterCost measures
// (GPUISO_COST_ROUNDS, default 2).
func costRounds() int {
	if n, err := strconv.Atoi(os.Getenv("GPUISO_COST_ROUNDS")); err == nil && n > 0 {
		return n
	}
	return 2
}

// costPods is the batch size: 60 pods over the three nodes.
const costPods = 60

// batchLatency creates the pods and returns the time from the first
// creation to the watch seeing every one Running.
func batchLatency(t *testing.T, c *cluster.Cluster, ns string, pods []*corev1.Pod) time.Duration {
	t.Helper()
	w, err := c.Client.CoreV1().Pods(ns).Watch(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	start := time.Now()
	for _, p := range pods {
		if _, err := c.Client.CoreV1().Pods(ns).Create(t.Context(), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	runningPods := map[string]bool{}
	guard := time.After(5 * time.Minute)
	for len(runningPods) < len(pods) {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatal("the watch ended")
			}
			if p, ok := ev.Object.(*corev1.Pod); ok && p.Status.Phase == corev1.PodRunning {
				runningPods[p.Name] = true
			}
		case <-guard:
			t.Fatalf("%d of %d pods Running after 5 minutes", len(runningPods), len(pods))
		}
	}
	return time.Since(start)
}

// deleteAll deletes every pod of ns and waits until they are gone.
func deleteAll(t *testing.T, c *cluster.Cluster, ns string) {
	t.Helper()
	if err := c.Client.CoreV1().Pods(ns).DeleteCollection(context.Background(), metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(1))},
		metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	until(t, "the pods of "+ns+" to be gone", func() bool {
		l, err := c.Client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{})
		return err == nil && len(l.Items) == 0
	})
}

// pluginMemory is the resident and peak memory (KiB) of the plugin
// process running in node n's pods.
func pluginMemory(n *cluster.Node) (rss, hwm int, ok bool) {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		cg, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup"))
		if !strings.HasPrefix(string(cmdline), cluster.PluginProgram+"\x00") || !strings.Contains(string(cg), "/"+n.CgroupName()+"/") {
			continue
		}
		b, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		for _, l := range strings.Split(string(b), "\n") {
			f := strings.Fields(l)
			if len(f) >= 2 && f[0] == "VmRSS:" {
				rss, _ = strconv.Atoi(f[1])
			}
			if len(f) >= 2 && f[0] == "VmHWM:" {
				hwm, _ = strconv.Atoi(f[1])
			}
		}
		return rss, hwm, true
	}
	return 0, 0, false
}

// testClusterCost measures, and only logs: 60 GPU pods over the three
// nodes against 60 pods without GPUs (time from the first creation to all
// Running, in pairs of batches taken in alternating order), the plugin's
// memory on each node, and the publication of a 16-GPU node's slice.
//
// The nodes have 20 whole GPUs, so the 60 GPU pods share: 10 ask for
// nvidia.com/gpu: 1 (a GPU each, through the DRA-served extended
// resource), 50 use 10 ResourceClaims of one GPU each, five pods a claim.
func testClusterCost(t *testing.T, c *cluster.Cluster) {
	if testing.Short() {
		t.Skip("measurements: not in -short")
	}
	waitNoClaims(t, c)
	const ns = "cost"
	namespace(t, c, ns)
	const claims, extended = 10, 10
	for i := range claims {
		claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("gpu-%d", i), Namespace: ns}}
		claim.Spec.Devices.Requests = []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{
			DeviceClassName: "gpu.gpuiso.io", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}}}
		if _, err := c.Client.ResourceV1().ResourceClaims(ns).Create(t.Context(), claim, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	gpuBatch := func(round int) []*corev1.Pod {
		var out []*corev1.Pod
		for i := range costPods {
			p := sleeper(ns, fmt.Sprintf("gpu-%d-%d", round, i))
			if i < extended {
				withGPUs(p, gpuResource, 1)
			} else {
				p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To(fmt.Sprintf("gpu-%d", (i-extended)%claims))}}
				p.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}}
			}
			out = append(out, p)
		}
		return out
	}
	plainBatch := func(round int) []*corev1.Pod {
		var out []*corev1.Pod
		for i := range costPods {
			out = append(out, sleeper(ns, fmt.Sprintf("plain-%d-%d", round, i)))
		}
		return out
	}
	var plain, gpu []time.Duration
	for r := range costRounds() {
		if r%2 == 0 {
			plain = append(plain, batchLatency(t, c, ns, plainBatch(r)))
			deleteAll(t, c, ns)
			gpu = append(gpu, batchLatency(t, c, ns, gpuBatch(r)))
		} else {
			gpu = append(gpu, batchLatency(t, c, ns, gpuBatch(r)))
			deleteAll(t, c, ns)
			plain = append(plain, batchLatency(t, c, ns, plainBatch(r)))
		}
		deleteAll(t, c, ns)
	}
	t.Logf("%d pods over %d nodes, first creation to all Running, median of %d paired batches: without GPUs %v, with GPUs %v "+
		"(%d with nvidia.com/gpu: 1, %d on %d shared claims of one GPU) (runs: %v / %v)",
		costPods, len(c.Nodes), len(plain), median(plain), median(gpu), extended, costPods-extended, claims, plain, gpu)
	for _, n := range c.Nodes {
		rss, hwm, ok := pluginMemory(n)
		if !ok {
			t.Errorf("no plugin process found on node %s", n.Name)
			continue
		}
		t.Logf("plugin memory on node %s (%s, after the batches): VmRSS %d KiB, VmHWM %d KiB", n.Name, nodeKinds[slicesIndex(c, n)], rss, hwm)
	}
	testSlice16(t, c)
}

func slicesIndex(c *cluster.Cluster, n *cluster.Node) int {
	for i, m := range c.Nodes {
		if m == n {
			return i
		}
	}
	return 0
}

// testSlice16 measures the publication of a 16-GPU node's ResourceSlice
// while the three nodes run: the program (simulating a DGX-2) for a Node
// that has no kubelet, from its start to the slice in the API.
func testSlice16(t *testing.T, c *cluster.Cluster) {
	const nodeName = "gpuiso-cost-dgx2"
	if _, err := c.Client.CoreV1().Nodes().Create(t.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx := context.Background()
		c.Client.CoreV1().Nodes().Delete(ctx, nodeName, metav1.DeleteOptions{})
		c.Client.ResourceV1().ResourceSlices().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{FieldSelector: "spec.nodeName=" + nodeName})
	}()
	// A short directory: the plugin's socket paths must fit a socket
	// address.
	dir := filepath.Join(c.Dir, "dgx2")
	if err := os.MkdirAll(filepath.Join(dir, "registry"), 0o755); err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	w, err := c.Client.ResourceV1().ResourceSlices().Watch(t.Context(), metav1.ListOptions{FieldSelector: "spec.nodeName=" + nodeName})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	cmd := exec.Command(pluginBin, "--simulate", "dgx2", "--sim-root", filepath.Join(dir, "host"), "--state-dir", filepath.Join(dir, "state"),
		"--node-name", nodeName, "--kubeconfig", c.Kubeconfig, "--cdi-dir", filepath.Join(dir, "cdi"), "--device-plugin=false",
		"--kubelet-plugins-dir", filepath.Join(dir, "plugins"), "--kubelet-registry-dir", filepath.Join(dir, "registry"))
	var log syncBuffer
	cmd.Stdout, cmd.Stderr = &log, &log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	}()
	guard := time.After(2 * time.Minute)
	for {
		select {
		case ev := <-w.ResultChan():
			s, ok := ev.Object.(*resourceapi.ResourceSlice)
			if ok && ev.Type != watch.Deleted && s.Spec.Driver == driver && len(s.Spec.Devices) == 16 {
				t.Logf("ResourceSlice of a 16-GPU node (dgx2) beside the three nodes: program start to the slice in the API %v",
					time.Since(start).Round(time.Millisecond))
				return
			}
		case <-done:
			t.Fatalf("the program exited; its log:\n%s", tail(log.String(), 3000))
		case <-guard:
			t.Fatalf("no slice of 16 GPUs after 2 minutes; the program's log:\n%s", tail(log.String(), 3000))
		}
	}
}
