package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/kubernetes/internal/cluster"
)

// The suite's cluster has three nodes, each simulating a GPU node of its
// own kind, named by its Node label simulateLabel (the chart's
// simulate.nodeLabel); its scheduler packs GPU pods (the documented
// kubernetes/deploy/scheduler/bin-packing.yaml).
const simulateLabel = "gpuiso.io/simulate"

// nodeKinds are the nodes' simulated kinds, in node order (127.0.0.1, .2,
// .3).
var nodeKinds = []string{"dgx1-volta", "dgx-a100", "hgx-h100-mig"}

// Where the chart and the scheduler configuration are, from this package.
var (
	chartDir        = filepath.Join("..", "deploy", "gpuiso")
	schedulerConfig = filepath.Join("..", "deploy", "scheduler", "bin-packing.yaml")
)

// pluginImage is the plugin's image as the nodes know it: the chart's
// default image (gpuiso-kubelet-plugin:<appVersion>), fully qualified as
// the runtime looks it up, as `make plugin-image` names it.
func pluginImage(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(chartDir, "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var chart struct {
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(b, &chart); err != nil || chart.AppVersion == "" {
		t.Fatalf("Chart.yaml: appVersion %q: %v", chart.AppVersion, err)
	}
	return "docker.io/library/gpuiso-kubelet-plugin:" + chart.AppVersion
}

// clusterConfig is the suite's cluster: three nodes, the bin-packing
// scheduler.
func clusterConfig(probe string) (cluster.Config, error) {
	sched, err := os.ReadFile(schedulerConfig)
	if err != nil {
		return cluster.Config{}, err
	}
	cfg := cluster.Config{Pause: probe, PauseArgs: cluster.PauseArgs, SchedulerConfig: sched}
	for _, k := range nodeKinds {
		cfg.Nodes = append(cfg.Nodes, cluster.NodeConfig{Labels: map[string]string{simulateLabel: k}})
	}
	return cfg, nil
}

// HelmEnv names the helm binary; DefaultHelm (.ci/helm-build.sh's) without
// it.
const (
	HelmEnv     = testenv.HelmEnv
	DefaultHelm = testenv.DefaultHelm
)

// helm runs the pinned helm against the cluster, its own state in a
// directory of the test's.
type helm struct {
	bin, home string
	c         *cluster.Cluster
}

func requireHelm(t *testing.T, c *cluster.Cluster) *helm {
	t.Helper()
	return &helm{bin: testenv.RequireHelm(t), home: t.TempDir(), c: c}
}

// uninstallAtEnd uninstalls the release when t ends, unless done says it
// is gone already, and waits until the plugin's namespace and every
// node's slice are gone: the next test's plugin process is then the only
// one of the node's driver. The cleanup runs after t's context ended, so
// it has a context of its own.
func (h *helm) uninstallAtEnd(t *testing.T, c *cluster.Cluster, done *bool) {
	t.Cleanup(func() {
		if done != nil && *done {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if out, err := h.run(ctx, "uninstall", release, "--namespace", "default", "--wait", "--timeout", "2m"); err != nil {
			t.Errorf("uninstall: %v\n%s", err, out)
		}
		for {
			_, err := c.Client.CoreV1().Namespaces().Get(ctx, pluginNS, metav1.GetOptions{})
			l, lerr := c.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
			left := 0
			for _, s := range l.Items {
				if s.Spec.Driver == driver {
					left++
				}
			}
			if apierrors.IsNotFound(err) && lerr == nil && left == 0 {
				return
			}
			select {
			case <-ctx.Done():
				t.Errorf("after the uninstall: the plugin's namespace (%v) or %d slices are left", err, left)
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
	})
}

func (h *helm) run(ctx context.Context, args ...string) (string, error) {
	if h.c != nil {
		args = append(args, "--kubeconfig", h.c.Kubeconfig)
	}
	cmd := exec.CommandContext(ctx, h.bin, args...)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+h.home+"/cache", "HELM_CONFIG_HOME="+h.home+"/config",
		"HELM_DATA_HOME="+h.home+"/data")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("helm %s: %w: %s", strings.Join(args, " "), err, out.String())
	}
	return out.String(), nil
}

// release is the suite's installation of the chart.
const (
	release   = "gpuiso"
	pluginNS  = "gpuiso-system"
	daemonSet = "gpuiso-kubelet-plugin"
)

// installValues are the values the suite installs with: the chart's own
// image, imported into the nodes beforehand (never pulled), each node's
// simulated kind from its label, the host's network and the API server's
// address (the cluster has neither a pod network nor kube-proxy), a quick
// health refresh, metrics on a free port of the node's address (the
// nodes share the host's loopback).
func installValues(t *testing.T, c *cluster.Cluster, metricsPort int) []string {
	t.Helper()
	rc, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(rc.Host)
	if err != nil {
		t.Fatal(err)
	}
	host, port := u.Hostname(), u.Port()
	return []string{
		"--set", "image.pullPolicy=Never",
		"--set", "simulate.nodeLabel=" + simulateLabel,
		"--set", "hostNetwork=true",
		"--set", "apiServer.host=" + host, "--set-string", "apiServer.port=" + port,
		"--set", "healthRefresh=2s",
		"--set", "metrics.enabled=true", "--set", "metrics.port=" + strconv.Itoa(metricsPort), "--set", "metrics.address=podIP",
	}
}

// freeMetricsPort is a TCP port free on every node's address.
func freeMetricsPort(t *testing.T, c *cluster.Cluster) int {
	t.Helper()
	for range 20 {
		var ls []net.Listener
		port, ok := 0, true
		for _, n := range c.Nodes {
			l, err := net.Listen("tcp", net.JoinHostPort(n.Name, strconv.Itoa(port)))
			if err != nil {
				ok = false
				break
			}
			ls = append(ls, l)
			port = l.Addr().(*net.TCPAddr).Port
		}
		for _, l := range ls {
			l.Close()
		}
		if ok {
			return port
		}
	}
	t.Fatal("no port free on every node's address")
	return 0
}

// nodeDevice is a device of a node's slice.
type nodeDevice struct {
	name, typ, uuid, model, clique string
	minor                          int
}

// slicesByNode lists the driver's published devices by node.
func slicesByNode(t *testing.T, c *cluster.Cluster) map[string][]nodeDevice {
	t.Helper()
	l, err := c.Client.ResourceV1().ResourceSlices().List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]nodeDevice{}
	for _, s := range l.Items {
		if s.Spec.Driver != driver || s.Spec.NodeName == nil {
			continue
		}
		for _, d := range s.Spec.Devices {
			a := func(k string) string {
				v := d.Attributes[resourceapi.QualifiedName(k)]
				if v.StringValue != nil {
					return *v.StringValue
				}
				if v.IntValue != nil {
					return strconv.FormatInt(*v.IntValue, 10)
				}
				return ""
			}
			minor, _ := strconv.Atoi(a("minor"))
			out[*s.Spec.NodeName] = append(out[*s.Spec.NodeName], nodeDevice{name: d.Name, typ: a("type"), uuid: a("uuid"),
				model: a("model"), clique: a("nvlinkClique"), minor: minor})
		}
	}
	return out
}

// wantDevices is the number of devices each node publishes: 8 V100, 8
// A100, 4 whole H100 and 15 MIG devices.
var wantDevices = map[string]int{"127.0.0.1": 8, "127.0.0.2": 8, "127.0.0.3": 19}

// wholeGPUs are each node's whole GPUs.
var wholeGPUs = map[string]int{"127.0.0.1": 8, "127.0.0.2": 8, "127.0.0.3": 4}

func publishedAsWanted(t *testing.T, c *cluster.Cluster) bool {
	byNode := slicesByNode(t, c)
	for n, want := range wantDevices {
		if len(byNode[n]) != want {
			return false
		}
	}
	return true
}

// nodeMajor is the GPU nodes' major number of the node's simulated host
// tree (in its state directory, where the chart puts it).
func nodeMajor(t *testing.T, n *cluster.Node) uint32 {
	t.Helper()
	dn, err := linux.StatDevice(filepath.Join(n.StateDir, "simulated", "dev", "nvidia0"))
	if err != nil {
		t.Fatal(err)
	}
	return dn.Major
}

// in places a probe pod in namespace ns.
func in(ns string, p *corev1.Pod) *corev1.Pod {
	p.Namespace = ns
	return p
}

// onNode pins the pod to a node.
func onNode(p *corev1.Pod, node string) *corev1.Pod {
	p.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": node}
	return p
}

// createIn creates the pod in its namespace; it is deleted when t ends.
func createIn(t *testing.T, c *cluster.Cluster, p *corev1.Pod) {
	t.Helper()
	if _, err := c.Client.CoreV1().Pods(p.Namespace).Create(t.Context(), p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteIn(t, c, p.Namespace, p.Name) })
}

// deleteIn deletes the pod and waits until it is gone.
func deleteIn(t *testing.T, c *cluster.Cluster, ns, name string) {
	t.Helper()
	ctx := context.Background()
	err := c.Client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(1))})
	if apierrors.IsNotFound(err) {
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	until(t, "pod "+ns+"/"+name+" to be gone", func() bool {
		_, err := c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
}

// running waits until the pod runs and returns it.
func running(t *testing.T, c *cluster.Cluster, ns, name string) *corev1.Pod {
	t.Helper()
	var p *corev1.Pod
	until(t, "pod "+ns+"/"+name+" to run", func() bool {
		var err error
		p, err = c.Client.CoreV1().Pods(ns).Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
			t.Fatalf("pod %s/%s ended: %+v", ns, name, p.Status)
		}
		return p.Status.Phase == corev1.PodRunning
	})
	return p
}

// scheduled waits until the pod has a node and returns it.
func scheduled(t *testing.T, c *cluster.Cluster, ns, name string) string {
	t.Helper()
	var node string
	until(t, "pod "+ns+"/"+name+" to be scheduled", func() bool {
		p, err := c.Client.CoreV1().Pods(ns).Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		node = p.Spec.NodeName
		return node != ""
	})
	return node
}

// probeOf waits for the pod's probe report.
func probeOf(t *testing.T, c *cluster.Cluster, ns, name string) seen {
	t.Helper()
	var out string
	until(t, "pod "+ns+"/"+name+"'s output", func() bool {
		b, err := c.Client.CoreV1().Pods(ns).GetLogs(name, &corev1.PodLogOptions{}).DoRaw(t.Context())
		out = string(b)
		return err == nil && strings.Contains(out, "cwd /")
	})
	return parseSeen(out)
}

// podDevices are the devices the pod's claims (its own, and the one the
// scheduler made for its extended resources) were allocated.
func podDevices(t *testing.T, c *cluster.Cluster, ns, name string) []string {
	t.Helper()
	var claims []string
	until(t, "pod "+ns+"/"+name+"'s claims", func() bool {
		p, err := c.Client.CoreV1().Pods(ns).Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		claims = nil
		for _, s := range p.Status.ResourceClaimStatuses {
			if s.ResourceClaimName != nil {
				claims = append(claims, *s.ResourceClaimName)
			}
		}
		if s := p.Status.ExtendedResourceClaimStatus; s != nil {
			claims = append(claims, s.ResourceClaimName)
		}
		return len(claims) > 0 && p.Spec.NodeName != ""
	})
	var out []string
	for _, name := range claims {
		claim, err := c.Client.ResourceV1().ResourceClaims(ns).Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if claim.Status.Allocation == nil {
			t.Fatalf("claim %s/%s is not allocated", ns, name)
		}
		for _, r := range claim.Status.Allocation.Devices.Results {
			out = append(out, r.Device)
		}
	}
	slices.Sort(out)
	return out
}

// checkIsolation compares what the pod saw with the devices it holds on
// its node.
func checkIsolation(t *testing.T, c *cluster.Cluster, ns, name string, s seen) {
	t.Helper()
	p, err := c.Client.CoreV1().Pods(ns).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	devs := slicesByNode(t, c)[p.Spec.NodeName]
	held := podDevices(t, c, ns, name)
	var all, minors []int
	var uuids []string
	for _, d := range devs {
		if d.typ == "gpu" {
			all = append(all, d.minor)
		}
		if slices.Contains(held, d.name) {
			uuids = append(uuids, d.uuid)
			minors = append(minors, d.minor)
		}
	}
	s.check(t, all, minors, uuids)
}

// gpuPod asks for n nvidia.com/gpu through the extended resource the
// chart's DeviceClass serves with DRA.
func gpuPod(ns, name string, major uint32, minors []int, n int64) *corev1.Pod {
	return in(ns, withGPUs(probePod(name, isolationArgs(major, minors, true)), gpuResource, n))
}

// sleeper is a pod that only sleeps.
func sleeper(ns, name string) *corev1.Pod { return in(ns, probePod(name, []string{"sleep", "100000"})) }

// templateIn makes a ResourceClaimTemplate in ns of count devices of
// class, with CEL selectors and a matchAttribute constraint ("" for
// none); it goes when t ends.
func templateIn(t *testing.T, c *cluster.Cluster, ns, name, class string, count int64, match string, cel ...string) {
	t.Helper()
	req := &resourceapi.ExactDeviceRequest{DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count}
	for _, e := range cel {
		req.Selectors = append(req.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: e}})
	}
	tmpl := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}
	tmpl.Spec.Spec.Devices.Requests = []resourceapi.DeviceRequest{{Name: "gpus", Exactly: req}}
	if match != "" {
		q := resourceapi.FullyQualifiedName(match)
		tmpl.Spec.Spec.Devices.Constraints = []resourceapi.DeviceConstraint{{Requests: []string{"gpus"}, MatchAttribute: &q}}
	}
	if _, err := c.Client.ResourceV1().ResourceClaimTemplates(ns).Create(t.Context(), tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Client.ResourceV1().ResourceClaimTemplates(ns).Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

// namespace makes a namespace for t; it is deleted when t ends.
func namespace(t *testing.T, c *cluster.Cluster, name string) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := c.Client.CoreV1().Namespaces().Create(t.Context(), ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	until(t, "namespace "+name+"'s default ServiceAccount", func() bool {
		_, err := c.Client.CoreV1().ServiceAccounts(name).Get(t.Context(), "default", metav1.GetOptions{})
		return err == nil
	})
	t.Cleanup(func() { c.Client.CoreV1().Namespaces().Delete(context.Background(), name, metav1.DeleteOptions{}) })
}

// daemonSetRolled reports whether the DaemonSet's every pod runs its
// current template and is available on each of the cluster's nodes.
func daemonSetRolled(t *testing.T, c *cluster.Cluster) bool {
	ds, err := c.Client.AppsV1().DaemonSets(pluginNS).Get(t.Context(), daemonSet, metav1.GetOptions{})
	if err != nil {
		return false
	}
	s := ds.Status
	n := int32(len(c.Nodes))
	return s.ObservedGeneration == ds.Generation && s.DesiredNumberScheduled == n && s.UpdatedNumberScheduled == n &&
		s.NumberAvailable == n && s.NumberReady == n
}

// pluginPods are the DaemonSet's pods by node.
func pluginPods(t *testing.T, c *cluster.Cluster) map[string]corev1.Pod {
	t.Helper()
	l, err := c.Client.CoreV1().Pods(pluginNS).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]corev1.Pod{}
	for _, p := range l.Items {
		if p.DeletionTimestamp == nil {
			out[p.Spec.NodeName] = p
		}
	}
	return out
}

// metric reads one value of a plugin's metrics endpoint.
func metric(t *testing.T, node string, port int, name string) string {
	t.Helper()
	resp, err := http.Get(fmt.Sprintf("http://%s:%d/metrics", node, port))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			return v
		}
	}
	t.Fatalf("no %s in %s's metrics:\n%s", name, node, b)
	return ""
}

// nodeFiles lists what gpuiso left in the node's directories: CDI specs,
// the plugin's state (checkpoints, allocator state, the simulated tree),
// and its sockets and socket directories in the kubelet's directories.
func nodeFiles(n *cluster.Node) []string {
	var out []string
	list := func(dir string, keep func(string) bool) {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if keep(e.Name()) {
				out = append(out, filepath.Join(dir, e.Name()))
			}
		}
	}
	all := func(string) bool { return true }
	list(n.CDIDir, all)
	list(n.StateDir, all)
	list(n.PluginsDir(), func(name string) bool { return strings.Contains(name, "gpuiso") })
	list(n.RegistryDir(), func(name string) bool { return strings.Contains(name, "gpuiso") })
	list(n.DevicePluginDir, func(name string) bool { return strings.Contains(name, "gpuiso") })
	return out
}

// clearForInstall removes what earlier tests of this package left that an
// installation would clash with: the DeviceClasses ensureClasses makes
// (the chart owns classes of the same names) and the files their plugin
// processes left in the first node's CDI directory.
func clearForInstall(t *testing.T, c *cluster.Cluster) {
	t.Helper()
	for _, name := range []string{"gpu.gpuiso.io", "mig.gpuiso.io"} {
		dc, err := c.Client.ResourceV1().DeviceClasses().Get(t.Context(), name, metav1.GetOptions{})
		if err == nil && dc.Labels["app.kubernetes.io/managed-by"] != "Helm" {
			if err := c.Client.ResourceV1().DeviceClasses().Delete(t.Context(), name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, n := range c.Nodes {
		for _, f := range nodeFiles(n) {
			t.Logf("removing %s, left by an earlier test's plugin process", f)
			os.RemoveAll(f)
		}
	}
}

// TestHelm installs gpuiso with helm on the three nodes, as a user would
// (the plugin's image imported into each node's containerd, `helm
// install` of kubernetes/deploy/gpuiso), and checks that the DaemonSet
// runs on every node and publishes each node's devices and labels, then:
// model selection, NVLinked pairs, bin-packing, per-namespace quotas, a
// rolling upgrade under running pods, a drain, the cost at cluster scale,
// and an uninstall that leaves nothing on the nodes.
func TestHelm(t *testing.T) {
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
	port := freeMetricsPort(t, c)
	values := installValues(t, c, port)
	start := time.Now()
	if out, err := h.run(ctx, append([]string{"install", release, chartDir, "--namespace", "default", "--wait", "--timeout", "3m"}, values...)...); err != nil {
		t.Fatalf("%v\n%s", err, c.Logs(2000))
	} else {
		t.Logf("helm install (%v):\n%s", time.Since(start).Round(time.Millisecond), out)
	}
	uninstalled := false
	h.uninstallAtEnd(t, c, &uninstalled)
	until(t, "the DaemonSet on every node", func() bool { return daemonSetRolled(t, c) })
	if pods := pluginPods(t, c); len(pods) != len(c.Nodes) {
		t.Fatalf("plugin pods on %d nodes, want %d", len(pods), len(c.Nodes))
	}
	until(t, "every node's slice", func() bool { return publishedAsWanted(t, c) })
	t.Logf("helm install to every node's devices published: %v", time.Since(start).Round(time.Millisecond))
	products := map[string]string{}
	for _, n := range c.Nodes {
		node, err := c.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		products[n.Name] = node.Labels["nvidia.com/gpu.product"]
		if products[n.Name] == "" {
			t.Errorf("node %s has no nvidia.com/gpu.product label: %v", n.Name, node.Labels)
		}
	}
	t.Logf("GPU products by node: %v", products)

	t.Run("model selection", func(t *testing.T) { testModelSelection(t, c, products) })
	t.Run("NVLinked pair lands where free", func(t *testing.T) { testNVLinkPair(t, c) })
	t.Run("bin-packing", func(t *testing.T) { testBinPacking(t, c) })
	t.Run("quota per namespace", func(t *testing.T) { testQuota(t, c) })
	t.Run("upgrade under running pods", func(t *testing.T) { testUpgrade(t, c, h) })
	t.Run("drain", func(t *testing.T) { testDrain(t, c, port) })
	t.Run("cost at cluster scale", func(t *testing.T) { testClusterCost(t, c) })
	t.Run("uninstall", func(t *testing.T) {
		uninstalled = true
		testUninstall(t, c, h)
	})
}

// testModelSelection: a pod that selects a GPU model by the node label
// lands on the node that has it, and so does a claim that selects it by
// the model attribute.
func testModelSelection(t *testing.T, c *cluster.Cluster, products map[string]string) {
	a100 := c.Nodes[1]
	p := gpuPod("default", "a100", nodeMajor(t, a100), minorsOn(t, c, a100.Name), 1)
	p.Spec.NodeSelector = map[string]string{"nvidia.com/gpu.product": products[a100.Name]}
	createIn(t, c, p)
	if got := running(t, c, "default", "a100").Spec.NodeName; got != a100.Name {
		t.Errorf("a pod selecting %s landed on %s, want %s", products[a100.Name], got, a100.Name)
	}
	checkIsolation(t, c, "default", "a100", probeOf(t, c, "default", "a100"))

	h100 := c.Nodes[2]
	var model string
	for _, d := range slicesByNode(t, c)[h100.Name] {
		if d.typ == "gpu" {
			model = d.model
		}
	}
	templateIn(t, c, "default", "h100", "gpu.gpuiso.io", 1, "", fmt.Sprintf(`device.attributes["gpu.gpuiso.io"].model == %q`, model))
	createIn(t, c, in("default", withClaim(probePod("h100", isolationArgs(nodeMajor(t, h100), minorsOn(t, c, h100.Name), true)), "h100")))
	if got := running(t, c, "default", "h100").Spec.NodeName; got != h100.Name {
		t.Errorf("a claim selecting model %s landed on %s, want %s", model, got, h100.Name)
	}
	checkIsolation(t, c, "default", "h100", probeOf(t, c, "default", "h100"))
}

// waitNoClaims waits until no ResourceClaim is left from the cases
// before (a deleted pod's claims go a moment after it), so that a case
// that counts free GPUs starts from every GPU free.
func waitNoClaims(t *testing.T, c *cluster.Cluster) {
	t.Helper()
	until(t, "the claims of earlier cases to go", func() bool {
		l, err := c.Client.ResourceV1().ResourceClaims("").List(t.Context(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, claim := range l.Items {
			if claim.Status.Allocation != nil {
				return false
			}
		}
		return true
	})
}

// minorsOn are the whole GPUs' minors of a node.
func minorsOn(t *testing.T, c *cluster.Cluster, node string) []int {
	var out []int
	for _, d := range slicesByNode(t, c)[node] {
		if d.typ == "gpu" {
			out = append(out, d.minor)
		}
	}
	return out
}

// modelOf is the model attribute of a node's whole GPUs.
func modelOf(t *testing.T, c *cluster.Cluster, node string) string {
	for _, d := range slicesByNode(t, c)[node] {
		if d.typ == "gpu" {
			return d.model
		}
	}
	t.Fatalf("node %s publishes no whole GPU", node)
	return ""
}

// testNVLinkPair: with GPUs held so that the DGX-1 keeps two free GPUs of
// different NVLink cliques, the A100 node one, and the H100 node two of
// its NVSwitch, a claim for two NVLinked GPUs lands on the H100 node.
func testNVLinkPair(t *testing.T, c *cluster.Cluster) {
	waitNoClaims(t, c)
	byNode := slicesByNode(t, c)
	volta, a100, h100 := c.Nodes[0].Name, c.Nodes[1].Name, c.Nodes[2].Name
	var cliques []string
	for _, d := range byNode[volta] {
		if !slices.Contains(cliques, d.clique) {
			cliques = append(cliques, d.clique)
		}
	}
	if len(cliques) != 2 {
		t.Fatalf("the DGX-1's GPUs are in cliques %v, want two", cliques)
	}
	model := func(node string) string {
		return fmt.Sprintf(`device.attributes["gpu.gpuiso.io"].model == %q`, modelOf(t, c, node))
	}
	holds := []struct {
		name  string
		count int64
		cel   []string
	}{
		{"hold-volta-0", 3, []string{model(volta), fmt.Sprintf(`device.attributes["gpu.gpuiso.io"].nvlinkClique == %q`, cliques[0])}},
		{"hold-volta-1", 3, []string{model(volta), fmt.Sprintf(`device.attributes["gpu.gpuiso.io"].nvlinkClique == %q`, cliques[1])}},
		{"hold-a100", 7, []string{model(a100)}},
		{"hold-h100", 2, []string{model(h100)}},
	}
	for _, hd := range holds {
		templateIn(t, c, "default", hd.name, "gpu.gpuiso.io", hd.count, "", hd.cel...)
		createIn(t, c, in("default", withClaim(probePod(hd.name, []string{"sleep", "100000"}), hd.name)))
	}
	for _, hd := range holds {
		running(t, c, "default", hd.name)
	}
	templateIn(t, c, "default", "linked-pair", "gpu.gpuiso.io", 2, "gpu.gpuiso.io/nvlinkClique")
	createIn(t, c, in("default", withClaim(probePod("pair", isolationArgs(nodeMajor(t, c.Nodes[2]), minorsOn(t, c, h100), true)), "linked-pair")))
	p := running(t, c, "default", "pair")
	if p.Spec.NodeName != h100 {
		t.Fatalf("the NVLinked pair landed on %s; the only free linked pair is on %s", p.Spec.NodeName, h100)
	}
	devs := podDevices(t, c, "default", "pair")
	var cl []string
	for _, d := range slicesByNode(t, c)[h100] {
		if slices.Contains(devs, d.name) {
			cl = append(cl, d.clique)
		}
	}
	if len(cl) != 2 || cl[0] != cl[1] || cl[0] == "" {
		t.Errorf("the pair %v is not in one NVLink clique: %v", devs, cl)
	}
	checkIsolation(t, c, "default", "pair", probeOf(t, c, "default", "pair"))
}

// testBinPacking: with the documented scheduler configuration (GPUs
// scored MostAllocated), six 1-GPU pods fill one node before the next,
// and a pod asking for eight GPUs still finds a node with all of them.
func testBinPacking(t *testing.T, c *cluster.Cluster) {
	waitNoClaims(t, c)
	var nodes []string
	used := map[string]int{}
	for i := range 6 {
		name := fmt.Sprintf("pack-%d", i)
		createIn(t, c, in("default", withGPUs(probePod(name, []string{"sleep", "100000"}), gpuResource, 1)))
		n := scheduled(t, c, "default", name)
		running(t, c, "default", name)
		if len(nodes) > 0 && n != nodes[len(nodes)-1] && used[nodes[len(nodes)-1]] < wholeGPUs[nodes[len(nodes)-1]] {
			t.Errorf("pod %s went to %s while %s, which the pods before it fill, has %d of %d GPUs free", name, n,
				nodes[len(nodes)-1], wholeGPUs[nodes[len(nodes)-1]]-used[nodes[len(nodes)-1]], wholeGPUs[nodes[len(nodes)-1]])
		}
		nodes = append(nodes, n)
		used[n]++
	}
	t.Logf("six 1-GPU pods, in order: %v", nodes)
	createIn(t, c, in("default", withGPUs(probePod("eight", []string{"sleep", "100000"}), gpuResource, 8)))
	p := running(t, c, "default", "eight")
	if used[p.Spec.NodeName] > 0 {
		t.Errorf("the 8-GPU pod runs on %s, which holds %d of the six", p.Spec.NodeName, used[p.Spec.NodeName])
	}
	t.Logf("the 8-GPU pod runs on %s", p.Spec.NodeName)
}

// testQuota: a ResourceQuota of two GPUs in namespace A (the extended
// resource, which also counts claims of the class that serves it, and the
// device class's devices) refuses the third GPU there, by either way of
// asking, while namespace B gets its own.
func testQuota(t *testing.T, c *cluster.Cluster) {
	waitNoClaims(t, c)
	namespace(t, c, "quota-a")
	namespace(t, c, "quota-b")
	q := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "gpus", Namespace: "quota-a"}, Spec: corev1.ResourceQuotaSpec{
		Hard: corev1.ResourceList{
			"requests." + gpuResource:                           resource.MustParse("2"),
			"gpu.gpuiso.io.deviceclass.resource.k8s.io/devices": resource.MustParse("2"),
		},
	}}
	if _, err := c.Client.CoreV1().ResourceQuotas("quota-a").Create(t.Context(), q, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	until(t, "the quota to be counted", func() bool {
		q, err := c.Client.CoreV1().ResourceQuotas("quota-a").Get(t.Context(), "gpus", metav1.GetOptions{})
		return err == nil && len(q.Status.Hard) == 2
	})
	createIn(t, c, withGPUs(sleeper("quota-a", "a1"), gpuResource, 1))
	running(t, c, "quota-a", "a1")
	templateIn(t, c, "quota-a", "one-gpu", "gpu.gpuiso.io", 1, "")
	createIn(t, c, withClaim(sleeper("quota-a", "a2"), "one-gpu"))
	running(t, c, "quota-a", "a2")

	// The third GPU: as an extended resource the pod is refused.
	_, err := c.Client.CoreV1().Pods("quota-a").Create(t.Context(), withGPUs(sleeper("quota-a", "a3"), gpuResource, 1), metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "exceeded quota") {
		t.Errorf("a third GPU as an extended resource in namespace quota-a: %v, want exceeded quota", err)
	}
	if err == nil {
		t.Cleanup(func() { deleteIn(t, c, "quota-a", "a3") })
	}
	// As a claim, the claim is refused and the pod waits.
	createIn(t, c, withClaim(sleeper("quota-a", "a4"), "one-gpu"))
	until(t, "a4's claim to be refused by the quota", func() bool {
		evs, err := c.Client.CoreV1().Events("quota-a").List(t.Context(), metav1.ListOptions{FieldSelector: "involvedObject.name=a4"})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs.Items {
			if strings.Contains(e.Message, "exceeded quota") {
				t.Logf("a4: %s: %s", e.Reason, e.Message)
				return true
			}
		}
		return false
	})
	// Namespace B gets its GPU.
	createIn(t, c, withGPUs(sleeper("quota-b", "b1"), gpuResource, 1))
	running(t, c, "quota-b", "b1")
	a4, err := c.Client.CoreV1().Pods("quota-a").Get(t.Context(), "a4", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if a4.Status.Phase != corev1.PodPending || a4.Spec.NodeName != "" {
		t.Errorf("a4, over the quota, is %s on %q", a4.Status.Phase, a4.Spec.NodeName)
	}
}

// testUpgrade: `helm upgrade` with a changed setting rolls the DaemonSet
// on every node while pods keep their GPUs (same containers, checked from
// inside again), and their claims are unprepared afterwards by the new
// plugin pods.
func testUpgrade(t *testing.T, c *cluster.Cluster, h *helm) {
	volta := c.Nodes[0]
	templateIn(t, c, "default", "up-one", "gpu.gpuiso.io", 1, "")
	args := isolationArgs(nodeMajor(t, volta), minorsOn(t, c, volta.Name), true)
	createIn(t, c, onNode(in("default", withClaim(probePod("up-claim", args), "up-one")), volta.Name))
	createIn(t, c, onNode(in("default", withGPUs(probePod("up-ext", args), gpuResource, 1)), volta.Name))
	kept := map[string]*corev1.Pod{}
	var specs, checkpoints []string
	for _, name := range []string{"up-claim", "up-ext"} {
		kept[name] = running(t, c, "default", name)
		checkIsolation(t, c, "default", name, probeOf(t, c, "default", name))
	}
	entries, _ := os.ReadDir(volta.CDIDir)
	for _, e := range entries {
		if strings.Contains(e.Name(), "claim") {
			specs = append(specs, filepath.Join(volta.CDIDir, e.Name()))
		}
	}
	entries, _ = os.ReadDir(filepath.Join(volta.StateDir, "claims"))
	for _, e := range entries {
		checkpoints = append(checkpoints, filepath.Join(volta.StateDir, "claims", e.Name()))
	}
	if len(specs) != 2 || len(checkpoints) != 2 {
		t.Fatalf("two prepared claims on %s: CDI specs %v, checkpoints %v", volta.Name, specs, checkpoints)
	}
	before := pluginPods(t, c)

	start := time.Now()
	if _, err := h.run(t.Context(), "upgrade", release, chartDir, "--namespace", "default", "--wait", "--timeout", "3m",
		"--reuse-values", "--set", "healthRefresh=3s"); err != nil {
		t.Fatal(err)
	}
	until(t, "the DaemonSet to roll", func() bool { return daemonSetRolled(t, c) })
	after := pluginPods(t, c)
	for node, p := range after {
		if before[node].UID == p.UID {
			t.Errorf("node %s: the plugin pod %s was not replaced", node, p.Name)
		}
		if !slices.Contains(p.Spec.Containers[0].Args, "--health-refresh=3s") {
			t.Errorf("node %s: the new pod's arguments %v lack the changed setting", node, p.Spec.Containers[0].Args)
		}
	}
	t.Logf("helm upgrade rolled the DaemonSet on %d nodes in %v", len(after), time.Since(start).Round(time.Millisecond))
	until(t, "the restarted plugins to publish again", func() bool { return publishedAsWanted(t, c) })

	for name, old := range kept {
		p := pod(t, c, name)
		if p.UID != old.UID || p.Status.Phase != corev1.PodRunning || p.Status.ContainerStatuses[0].RestartCount != 0 ||
			p.Status.ContainerStatuses[0].ContainerID != old.Status.ContainerStatuses[0].ContainerID {
			t.Errorf("after the upgrade pod %s is %s, %d restarts, container %s (was %s)", name, p.Status.Phase,
				p.Status.ContainerStatuses[0].RestartCount, p.Status.ContainerStatuses[0].ContainerID, old.Status.ContainerStatuses[0].ContainerID)
		}
		out, err := c.Kubectl(t.Context(), append([]string{"exec", name, "--", "/probe"}, isolationArgs(nodeMajor(t, volta), minorsOn(t, c, volta.Name), false)...)...)
		if err != nil {
			t.Fatal(err)
		}
		checkIsolation(t, c, "default", name, parseSeen(out))
	}
	for _, f := range append(specs, checkpoints...) {
		if _, err := os.Stat(f); err != nil {
			t.Errorf("after the upgrade: %v", err)
		}
	}
	for name := range kept {
		deleteIn(t, c, "default", name)
	}
	until(t, "the claims' CDI specs and checkpoints to go", func() bool {
		for _, f := range append(specs, checkpoints...) {
			if _, err := os.Stat(f); err == nil {
				return false
			}
		}
		return true
	})
}

// testDrain: `kubectl drain` of a node evicts its GPU pods, and the plugin
// there frees their GPUs: no claim prepared, no device held.
func testDrain(t *testing.T, c *cluster.Cluster, port int) {
	n := c.Nodes[1]
	templateIn(t, c, "default", "drain-one", "gpu.gpuiso.io", 1, "")
	createIn(t, c, onNode(withClaim(sleeper("default", "drain-claim"), "drain-one"), n.Name))
	createIn(t, c, onNode(withGPUs(sleeper("default", "drain-ext"), gpuResource, 2), n.Name))
	running(t, c, "default", "drain-claim")
	running(t, c, "default", "drain-ext")
	if held := metric(t, n.Name, port, "gpuiso_devices_held"); held != "3" {
		t.Errorf("before the drain node %s's plugin holds %s devices, want 3", n.Name, held)
	}
	defer c.Kubectl(context.Background(), "uncordon", n.Name)
	if out, err := c.Kubectl(t.Context(), "drain", n.Name, "--ignore-daemonsets", "--force", "--delete-emptydir-data",
		"--grace-period", "1", "--timeout", "2m"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	until(t, "the node's GPUs to be free", func() bool {
		return metric(t, n.Name, port, "gpuiso_devices_held") == "0" && metric(t, n.Name, port, "gpuiso_claims_prepared") == "0"
	})
	entries, _ := os.ReadDir(filepath.Join(n.StateDir, "claims"))
	if len(entries) > 0 {
		t.Errorf("checkpoints left on the drained node: %v", entries)
	}
	entries, _ = os.ReadDir(n.CDIDir)
	for _, e := range entries {
		if strings.Contains(e.Name(), "claim") {
			t.Errorf("a claim's CDI spec is left on the drained node: %s", e.Name())
		}
	}
	// The plugin itself stays (a DaemonSet's pod is not drained).
	if p, ok := pluginPods(t, c)[n.Name]; !ok || p.Status.Phase != corev1.PodRunning {
		t.Errorf("the plugin's pod on the drained node: %v", p.Status.Phase)
	}
}

// testUninstall: `helm uninstall` removes the DaemonSet, and on every
// node the plugin leaves no slice, CDI spec, checkpoint, state or socket.
func testUninstall(t *testing.T, c *cluster.Cluster, h *helm) {
	start := time.Now()
	if _, err := h.run(t.Context(), "uninstall", release, "--namespace", "default", "--wait", "--timeout", "2m"); err != nil {
		t.Fatal(err)
	}
	until(t, "the plugin's namespace to go", func() bool {
		_, err := c.Client.CoreV1().Namespaces().Get(t.Context(), pluginNS, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	until(t, "the nodes' slices to go", func() bool { return len(slicesByNode(t, c)) == 0 })
	t.Logf("helm uninstall to no slice left: %v", time.Since(start).Round(time.Millisecond))
	for _, n := range c.Nodes {
		if left := nodeFiles(n); len(left) > 0 {
			t.Errorf("node %s: left after the uninstall: %v", n.Name, left)
		}
	}
	dcs, err := c.Client.ResourceV1().DeviceClasses().List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, dc := range dcs.Items {
		if strings.HasSuffix(dc.Name, ".gpuiso.io") {
			t.Errorf("DeviceClass %s is left", dc.Name)
		}
	}
}
