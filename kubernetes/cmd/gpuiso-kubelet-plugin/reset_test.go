package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
)

// TestGPUReset runs the program with --gpu-reset against a real
// kube-apiserver over a simulated host tree: XID 109 injected into a GPU
// no claim holds (as gpuinfo --inject does) taints it NoExecute, it is
// reset and published untainted; a GPU whose resets fail (gpuinfo
// --inject 'reset fail') keeps a NoExecute taint, unhealthy for a reboot;
// no other GPU is reset or tainted.
func TestGPUReset(t *testing.T) {
	testenv.RequireRoot(t)
	dir, err := os.MkdirTemp("", "gkreset")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	kubeconfig := apiServer(t, dir)
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	until(t, "the API server", func() bool {
		_, err := c.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err == nil
	})
	if _, err := c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	plugins, root := filepath.Join(dir, "plugins"), filepath.Join(dir, "host")
	if err := os.MkdirAll(filepath.Join(dir, "reg"), 0o755); err != nil {
		t.Fatal(err)
	}
	args := []string{"--simulate", "dgx1-volta", "--sim-root", root, "--device-plugin=false", "--gpu-reset",
		"--kubeconfig", kubeconfig, "--node-name", "n1", "--state-dir", filepath.Join(dir, "state"), "--health-refresh", "200ms", "--health-period", "100ms",
		"--cdi-dir", filepath.Join(dir, "cdi"), "--kubelet-plugins-dir", plugins, "--kubelet-registry-dir", filepath.Join(dir, "reg")}
	pctx, cancel := context.WithCancel(ctx)
	var logs bytes.Buffer
	done := make(chan int, 1)
	go func() { done <- run(pctx, args, &logs) }()
	defer func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("exit %d: %s", code, logs.String())
		}
	}()
	taintsOf := func(name string) []resourceapi.DeviceTaint {
		l, err := c.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil || len(l.Items) != 1 {
			return nil
		}
		for _, d := range l.Items[0].Spec.Devices {
			if d.Name == name {
				return d.Taints
			}
		}
		return nil
	}
	published := func() bool {
		l, err := c.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		return err == nil && len(l.Items) == 1
	}
	until(t, "the slice", published)

	injector, err := simnode.New("dgx1-volta")
	if err != nil {
		t.Fatal(err)
	}
	host, err := injector.OpenHost(ctx, root)
	if err != nil {
		t.Fatal(err)
	}
	if err := injector.ShareFaults(host); err != nil {
		t.Fatal(err)
	}
	noExecute := func(name, value string) func() bool {
		return func() bool {
			ts := taintsOf(name)
			return len(ts) == 1 && ts[0].Value == value && ts[0].Effect == resourceapi.DeviceTaintEffectNoExecute
		}
	}
	if err := injector.FailResets(6, true); err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{5, 6} {
		if err := injector.Inject(i, node.Signal{Kind: node.SignalXID, Value: 109}); err != nil {
			t.Fatal(err)
		}
	}
	until(t, "gpu-5 reset", func() bool { return injector.Resets(5) == 1 })
	until(t, "gpu-5 untainted after its reset", func() bool { return len(taintsOf("gpu-5")) == 0 })
	until(t, "gpu-6's reset tried", func() bool { return injector.Resets(6) == 1 })
	until(t, "gpu-6 tainted NoExecute after its failed reset", noExecute("gpu-6", "xid-109"))
	// The allocator's state, as another program of the node reads it.
	inv, err := nvmlnode.Discover(ctx, injector.DiscoverOptions(host)...)
	if err != nil {
		t.Fatal(err)
	}
	a, err := allocator.New(inv, allocator.WithStateDir(filepath.Join(dir, "state", "allocator")))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if h := a.Devices()[6].Health; h.Healthy || !strings.HasSuffix(h.Reason, ": reboot") {
		t.Errorf("GPU 6 after its failed reset: %s", h)
	}
	if h := a.Devices()[5].Health; !h.Healthy {
		t.Errorf("GPU 5 after its reset: %s", h)
	}
	for i := range injector.Len() {
		name := "gpu-" + strconv.Itoa(i)
		if i != 5 && i != 6 && (injector.Resets(i) != 0 || len(taintsOf(name)) != 0) {
			t.Errorf("GPU %d touched: %d resets, taints %v", i, injector.Resets(i), taintsOf(name))
		}
	}
	if n := injector.Resets(6); n != 1 {
		t.Errorf("gpu-6 reset %d times", n)
	}
}
