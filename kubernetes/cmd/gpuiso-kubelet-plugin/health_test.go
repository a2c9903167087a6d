package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
)

// TestHealthService runs the program against a real kube-apiserver and
// watches its health through the DRA health gRPC service as the kubelet
// does: every device Healthy in the node's pool at first; a GPU marked
// lost (through the allocator's state, as another process of the node
// would) turns Unhealthy with its reason in the stream, and NoExecute
// tainted in the published slice; healthy again, its taint goes. A fault
// injected into the simulated host tree (as gpuinfo --inject does from
// another process) is the health monitor's: XID 79 makes a GPU Unhealthy
// and tainted; cleared, it is Healthy again on its own and untainted.
func TestHealthService(t *testing.T) {
	testenv.RequireRoot(t)
	dir, err := os.MkdirTemp("", "gkhealth")
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
	plugins, state := filepath.Join(dir, "plugins"), filepath.Join(dir, "state")
	if err := os.MkdirAll(filepath.Join(dir, "reg"), 0o755); err != nil {
		t.Fatal(err)
	}
	args := []string{"--simulate", "dgx1-volta", "--sim-root", filepath.Join(dir, "host"), "--device-plugin=false",
		"--kubeconfig", kubeconfig, "--node-name", "n1", "--state-dir", state, "--health-refresh", "200ms", "--health-period", "100ms",
		"--cdi-dir", filepath.Join(dir, "cdi"), "--kubelet-plugins-dir", plugins, "--kubelet-registry-dir", filepath.Join(dir, "reg")}
	sock := filepath.Join(plugins, "gpu.gpuiso.io", "dra.sock")
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
	until(t, "the DRA socket", func() bool {
		_, err := os.Stat(sock)
		return err == nil
	})

	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	stream, err := drahealthv1.NewDRAResourceHealthClient(conn).NodeWatchResources(wctx, &drahealthv1.NodeWatchResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	recv := func() map[string]*drahealthv1.DeviceHealth {
		t.Helper()
		r, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]*drahealthv1.DeviceHealth{}
		for _, d := range r.Devices {
			out[d.GetDevice().GetDeviceName()] = d
		}
		return out
	}
	first := recv()
	if len(first) != 8 {
		t.Fatalf("first report of %d devices, want 8", len(first))
	}
	for name, d := range first {
		if d.Health != drahealthv1.HealthStatus_HEALTHY || d.GetDevice().GetPoolName() != "n1" {
			t.Errorf("%s: %v", name, d)
		}
	}

	sim, err := simnode.New("dgx1-volta")
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dir, "host")
	inv, err := nvmlnode.Discover(ctx, sim.DiscoverOptions(&simnode.Host{Root: root, DevRoot: filepath.Join(root, "dev"), ProcRoot: filepath.Join(root, "proc"), SysRoot: filepath.Join(root, "sys")})...)
	if err != nil {
		t.Fatal(err)
	}
	mark := func(reason string) {
		t.Helper()
		a, err := allocator.New(inv, allocator.WithStateDir(filepath.Join(state, "allocator")))
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		if reason == "" {
			err = a.MarkHealthy(ctx, inv.Devices[3].UUID)
		} else {
			_, err = a.MarkUnhealthy(ctx, inv.Devices[3].UUID, reason)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
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
	taints := func() []resourceapi.DeviceTaint { return taintsOf("gpu-3") }
	mark("XID 79")
	for {
		d := recv()["gpu-3"]
		if d.GetHealth() == drahealthv1.HealthStatus_UNHEALTHY {
			if !strings.Contains(d.GetMessage(), "XID 79") {
				t.Errorf("gpu-3's health message %q, want its reason", d.GetMessage())
			}
			break
		}
	}
	until(t, "gpu-3 tainted NoExecute", func() bool {
		ts := taints()
		return len(ts) == 1 && ts[0].Key == "gpu.gpuiso.io/unhealthy" && ts[0].Value == "xid-79" && ts[0].Effect == resourceapi.DeviceTaintEffectNoExecute
	})
	mark("")
	for recv()["gpu-3"].GetHealth() != drahealthv1.HealthStatus_HEALTHY {
	}
	until(t, "gpu-3's taint to go", func() bool { return len(taints()) == 0 })

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
	if err := injector.Inject(5, node.Signal{Kind: node.SignalXID, Value: 79}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(90 * time.Second)
	for d := recv()["gpu-5"]; d.GetHealth() != drahealthv1.HealthStatus_UNHEALTHY; d = recv()["gpu-5"] {
		if time.Now().After(deadline) {
			t.Fatal("gpu-5 never reported Unhealthy after XID 79")
		}
	}
	// XID 79 makes the simulated GPU fall off the bus: its event and the
	// poll that finds it lost race, and the first to mark the GPU names
	// the taint (a GPU marked for a reboot keeps that reason).
	until(t, "gpu-5 tainted NoExecute", func() bool {
		ts := taintsOf("gpu-5")
		return len(ts) == 1 && (ts[0].Value == "xid-79" || ts[0].Value == "gpu-lost") && ts[0].Effect == resourceapi.DeviceTaintEffectNoExecute
	})
	if err := injector.Clear(5); err != nil {
		t.Fatal(err)
	}
	for recv()["gpu-5"].GetHealth() != drahealthv1.HealthStatus_HEALTHY {
		if time.Now().After(deadline) {
			t.Fatal("gpu-5 never reported Healthy after clear")
		}
	}
	until(t, "gpu-5's taint to go", func() bool { return len(taintsOf("gpu-5")) == 0 })
}

// TestHealthFlags: --health-rules over the default table, checked at
// start: a rule that does not read, or a file that is not there, exits 2
// naming the flag; --health-period must be positive.
func TestHealthFlags(t *testing.T) {
	dir := t.TempDir()
	good, bad := filepath.Join(dir, "good"), filepath.Join(dir, "bad")
	if err := os.WriteFile(good, []byte("# this fleet drains on XID 94\nxid 94 unhealthy drain\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte("xid 94 sick drain\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, args := range map[string][]string{
		"bad rule":    {"--health-rules", bad},
		"no file":     {"--health-rules", filepath.Join(dir, "none")},
		"zero period": {"--health-period", "0s"},
	} {
		var out bytes.Buffer
		if _, code, done := parse(args, &out); !done || code != 2 || !strings.Contains(out.String(), "--health-") {
			t.Errorf("%s: %d, %v, %q", name, code, done, out.String())
		}
	}
	f, _, done := parse([]string{"--health-rules", good, "--health-period", "2s"}, &bytes.Buffer{})
	if done {
		t.Fatal("good health flags refused")
	}
	if v := f.healthTable.Classify(node.Signal{Kind: node.SignalXID, Value: 94}); v.State != node.StateUnhealthy || f.healthPeriod != 2*time.Second {
		t.Errorf("XID 94 by the table: %+v; period %s", v, f.healthPeriod)
	}
	if v := f.healthTable.Classify(node.Signal{Kind: node.SignalXID, Value: 109}); v.Action != node.ActionResetGPU {
		t.Errorf("the default table lost: XID 109 %+v", v)
	}
}
