package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"os/exec"
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
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
)

// K8sBinEnv names the directory of the pinned Kubernetes binaries
// (.ci/k8s-build.sh builds them); DefaultK8sBin is where that script puts
// them.
const (
	K8sBinEnv     = "GPUISO_K8S_BIN"
	DefaultK8sBin = "/var/cache/gpuiso/k8s-v1.37.2/bin"
)

// apiServer starts etcd and kube-apiserver on free 127.0.0.1 ports in
// dir and returns an admin kubeconfig file; both are stopped at cleanup.
func apiServer(t *testing.T, dir string) string {
	t.Helper()
	bin := os.Getenv(K8sBinEnv)
	if bin == "" {
		bin = DefaultK8sBin
	}
	for _, b := range []string{"etcd", "kube-apiserver"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			t.Skipf("no %s in %s (run .ci/k8s-build.sh or set %s): %v", b, bin, K8sBinEnv, err)
		}
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	saKey := write("sa.key", pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}))
	saPub := write("sa.pub", pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}))
	tokens := write("tokens.csv", []byte("admintoken,admin,admin,system:masters\n"))
	ports := freePorts(t, 3)
	start := func(name string, args ...string) {
		var log bytes.Buffer
		cmd := exec.Command(filepath.Join(bin, name), args...)
		cmd.Stdout, cmd.Stderr = &log, &log
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			cmd.Process.Kill()
			cmd.Wait()
			if t.Failed() {
				t.Logf("%s:\n%s", name, tail(log.String(), 3000))
			}
		})
	}
	etcd := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	peer := fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	start("etcd", "--data-dir", filepath.Join(dir, "etcd"), "--listen-client-urls", etcd, "--advertise-client-urls", etcd,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer, "--initial-cluster", "default="+peer)
	server := fmt.Sprintf("https://127.0.0.1:%d", ports[2])
	start("kube-apiserver", "--etcd-servers", etcd, "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
		"--endpoint-reconciler-type", "none", "--secure-port", fmt.Sprint(ports[2]), "--cert-dir", filepath.Join(dir, "pki"),
		"--token-auth-file", tokens, "--authorization-mode", "RBAC",
		"--service-account-key-file", saPub, "--service-account-signing-key-file", saKey,
		"--service-account-issuer", server, "--service-cluster-ip-range", "10.250.0.0/24")
	return write("kubeconfig", fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: %q, insecure-skip-tls-verify: true}}]
users: [{name: admin, user: {token: admintoken}}]
contexts: [{name: c, context: {cluster: c, user: admin}}]
current-context: c
`, server))
}

func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var out []int
	var ls []net.Listener
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
		out = append(out, l.Addr().(*net.TCPAddr).Port)
	}
	for _, l := range ls {
		l.Close()
	}
	return out
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// until polls cond every 100ms until it holds; the limit is a deadlock
// guard, not a measurement.
func until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestAPIServer runs the program against a real kube-apiserver (Kubernetes
// 1.37, the pinned build) without a kubelet: it publishes the node's
// ResourceSlice and labels the Node; a claim allocated there is prepared
// through the DRA gRPC service as the kubelet would call it, kept over a
// restart of the program, and unprepared (twice) after it.
func TestAPIServer(t *testing.T) {
	testenv.RequireRoot(t)
	dir, err := os.MkdirTemp("", "gkapi")
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

	plugins := filepath.Join(dir, "plugins")
	args := []string{"--simulate", "dgx1-volta", "--sim-root", filepath.Join(dir, "host"), "--device-plugin=false",
		"--kubeconfig", kubeconfig, "--node-name", "n1", "--state-dir", filepath.Join(dir, "state"),
		"--cdi-dir", filepath.Join(dir, "cdi"), "--kubelet-plugins-dir", plugins, "--kubelet-registry-dir", filepath.Join(dir, "reg")}
	if err := os.MkdirAll(filepath.Join(dir, "reg"), 0o755); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(plugins, "gpu.gpuiso.io", "dra.sock")
	startPlugin := func() (stop func()) {
		pctx, cancel := context.WithCancel(ctx)
		var logs bytes.Buffer
		done := make(chan int, 1)
		go func() { done <- run(pctx, args, &logs) }()
		until(t, "the DRA socket", func() bool {
			_, err := os.Stat(sock)
			return err == nil
		})
		return func() {
			cancel()
			if code := <-done; code != 0 {
				t.Errorf("exit %d: %s", code, logs.String())
			}
			os.Remove(sock)
		}
	}
	stop := startPlugin()

	var slice resourceapi.ResourceSlice
	until(t, "the ResourceSlice", func() bool {
		l, err := c.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil || len(l.Items) != 1 {
			return false
		}
		slice = l.Items[0]
		return true
	})
	if slice.Spec.Driver != "gpu.gpuiso.io" || slice.Spec.NodeName == nil || *slice.Spec.NodeName != "n1" || len(slice.Spec.Devices) != 8 {
		t.Errorf("slice: driver %q node %v, %d devices", slice.Spec.Driver, slice.Spec.NodeName, len(slice.Spec.Devices))
	}
	n, err := c.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n.Labels["nvidia.com/gpu.count"] != "8" || n.Labels["nvidia.com/gpu.family"] != "volta" {
		t.Errorf("node labels %v", n.Labels)
	}

	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "two", Namespace: "default"}}
	claim.Spec.Devices.Requests = []resourceapi.DeviceRequest{{Name: "gpus", Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: "gpu.gpuiso.io", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 2,
	}}}
	if claim, err = c.ResourceV1().ResourceClaims("default").Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	claim.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
		{Request: "gpus", Driver: "gpu.gpuiso.io", Pool: "n1", Device: "gpu-0"},
		{Request: "gpus", Driver: "gpu.gpuiso.io", Pool: "n1", Device: "gpu-1"},
	}}}
	if claim, err = c.ResourceV1().ResourceClaims("default").UpdateStatus(ctx, claim, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	uid := string(claim.UID)
	pbClaims := []*drapb.Claim{{Namespace: "default", Name: "two", Uid: uid}}
	prepare := func() string {
		conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		r, err := drapb.NewDRAPluginClient(conn).NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: pbClaims})
		if err != nil {
			t.Fatal(err)
		}
		res := r.Claims[uid]
		if res.GetError() != "" || len(res.GetDevices()) != 2 {
			t.Fatalf("prepare: %v", res)
		}
		return strings.Join(res.Devices[0].CdiDeviceIds, ",")
	}
	unprepare := func() {
		conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		r, err := drapb.NewDRAPluginClient(conn).NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: pbClaims})
		if err != nil || r.Claims[uid].GetError() != "" {
			t.Fatalf("unprepare: %v, %v", r, err)
		}
	}
	// The claim's own spec, and the framework's for its device metadata
	// file (--device-metadata, on by default).
	want := "gpu.gpuiso.io/claim=alloc-claim-" + uid + ",gpu.gpuiso.io/metadata=" + uid + "_gpus"
	if got := prepare(); got != want {
		t.Errorf("CDI ids %q, want %q", got, want)
	}
	spec := filepath.Join(dir, "cdi", "gpu.gpuiso.io-claim_alloc-claim-"+uid+".json")
	if _, err := os.Stat(spec); err != nil {
		t.Errorf("claim's CDI spec: %v", err)
	}

	// Only root, the kubelet, may connect to the plugin's sockets.
	regs, _ := filepath.Glob(filepath.Join(dir, "reg", "*.sock"))
	if len(regs) != 1 {
		t.Errorf("registration sockets %v, want one", regs)
	}
	for _, p := range append(regs, sock) {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != os.ModeSocket|0o600 {
			t.Errorf("socket %s: mode %v, want %v", p, fi.Mode(), os.ModeSocket|0o600)
		}
	}

	// The node reboots: the program stops, the CDI directory is emptied
	// (it is /var/run/cdi), the checkpoints are kept. Started again, the
	// program has written the claim's spec back, as it was, before the
	// kubelet can reach it; the claim is still prepared.
	written, err := os.ReadFile(spec)
	if err != nil {
		t.Fatal(err)
	}
	stop()
	if err := os.RemoveAll(filepath.Join(dir, "cdi")); err != nil {
		t.Fatal(err)
	}
	stop = startPlugin()
	defer func() { stop() }()
	if got, err := os.ReadFile(spec); err != nil || !bytes.Equal(got, written) {
		t.Errorf("the claim's CDI spec after the reboot: %v\n%s\nwant\n%s", err, got, written)
	}
	if got := prepare(); got != want {
		t.Errorf("after the restart: CDI ids %q, want %q", got, want)
	}
	unprepare()
	unprepare()
	if _, err := os.Stat(spec); !os.IsNotExist(err) {
		t.Errorf("CDI spec left after unprepare: %v", err)
	}
}
