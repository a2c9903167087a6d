package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/kubernetes/internal/cluster"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
)

// The cluster is started once, by the first test that needs it, and
// stopped after the last; TestMain then fails the run if anything of it is
// left on the host.
var (
	once       sync.Once
	shared     *cluster.Cluster
	startErr   error
	probe      string // the static probe: the pods' program
	pluginBin  string // gpuiso-kubelet-plugin, built
	buildDir   string
	probeImage = "gpuiso.test/probe:e2e"
)

func TestMain(m *testing.M) {
	cleanup := testenv.OffHostTmp()
	code := m.Run()
	if shared != nil {
		if err := shared.Stop(context.Background()); err != nil {
			fmt.Fprintf(os.Stderr, "stop the cluster: %v\n", err)
			code = 1
		}
		if left := shared.Leftovers(); len(left) > 0 {
			fmt.Fprintf(os.Stderr, "left on the host after the cluster stopped:\n%s\n", strings.Join(left, "\n"))
			code = 1
		}
	}
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	cleanup()
	os.Exit(code)
}

// requireCluster returns the shared cluster, starting it on first use; it
// skips t where no cluster can run (failing under GPUISO_REQUIRE=all).
func requireCluster(t *testing.T) *cluster.Cluster {
	t.Helper()
	testenv.RequireKubernetes(t, cluster.Config{}.Missing()...)
	once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		if buildDir, startErr = os.MkdirTemp("", "e2e-bin-"); startErr != nil {
			return
		}
		if probe, startErr = cluster.BuildProbe(ctx, buildDir); startErr != nil {
			return
		}
		pluginBin = filepath.Join(buildDir, "gpuiso-kubelet-plugin")
		// Stripped: the same binary goes into the plugin's image.
		cmd := exec.CommandContext(ctx, "go", "build", "-buildvcs=false", "-ldflags=-s -w", "-o", pluginBin, "github.com/gpuiso/gpuiso/kubernetes/cmd/gpuiso-kubelet-plugin")
		if out, err := cmd.CombinedOutput(); err != nil {
			startErr = fmt.Errorf("build gpuiso-kubelet-plugin: %w\n%s", err, out)
			return
		}
		var cfg cluster.Config
		if cfg, startErr = clusterConfig(probe); startErr != nil {
			return
		}
		if shared, startErr = cluster.Start(ctx, cfg); startErr != nil {
			return
		}
		startErr = shared.ImportImage(ctx, probeImage, probe, nil)
	})
	if startErr != nil {
		t.Fatal(startErr)
	}
	return shared
}

// until polls cond every 100 ms until it holds; the limit is a guard
// against a hang, not a measurement.
func until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// plugin is gpuiso-kubelet-plugin run as a process on a simulated node.
type plugin struct {
	t        *testing.T
	c        *cluster.Cluster
	profile  string
	args     []string
	stateDir string
	devRoot  string
	cmd      *exec.Cmd
	done     chan struct{}
	log      *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startPlugin runs the plugin for a simulated node of profile with its
// sockets in the cluster's kubelet directories; extra are more flags. It
// is stopped when t ends, after t's pods are deleted.
func startPlugin(t *testing.T, c *cluster.Cluster, profile string, extra ...string) *plugin {
	t.Helper()
	dir := t.TempDir()
	p := &plugin{t: t, c: c, profile: profile, stateDir: filepath.Join(dir, "state"), devRoot: filepath.Join(dir, "host")}
	p.args = append([]string{"--simulate", profile, "--sim-root", p.devRoot, "--state-dir", p.stateDir,
		"--node-name", cluster.NodeName, "--kubeconfig", c.Kubeconfig, "--cdi-dir", c.CDIDir,
		"--kubelet-plugins-dir", c.PluginsDir(), "--kubelet-registry-dir", c.RegistryDir(),
		"--device-plugin-dir", c.DevicePluginDir, "--health-refresh", "1s",
		"--pod-resources-socket", filepath.Join(c.KubeletRoot, "pod-resources", "kubelet.sock")}, extra...)
	p.start()
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			t.Logf("plugin log:\n%s", tail(p.log.String(), 4000))
		}
	})
	return p
}

func (p *plugin) start() {
	p.t.Helper()
	p.log = &syncBuffer{}
	p.cmd = exec.Command(pluginBin, p.args...)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	p.done = make(chan struct{})
	go func() {
		p.cmd.Wait()
		close(p.done)
	}()
}

// stop ends the plugin (SIGTERM, SIGKILL after 20 s).
func (p *plugin) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
}

// inventory is the simulated node as the plugin discovers it.
func (p *plugin) inventory() *node.Inventory {
	p.t.Helper()
	var inv *node.Inventory
	until(p.t, "the simulated host tree", func() bool {
		_, err := os.Stat(filepath.Join(p.devRoot, "proc"))
		return err == nil
	})
	sim, err := simnode.New(p.profile)
	if err != nil {
		p.t.Fatal(err)
	}
	host := &simnode.Host{Root: p.devRoot, DevRoot: filepath.Join(p.devRoot, "dev"), ProcRoot: filepath.Join(p.devRoot, "proc"), SysRoot: filepath.Join(p.devRoot, "sys")}
	until(p.t, "the simulated node's inventory", func() bool {
		inv, err = nvmlnode.Discover(p.t.Context(), sim.DiscoverOptions(host)...)
		return err == nil
	})
	return inv
}

// major is the simulated GPU nodes' major number (simulated hosts use
// one that no driver of the real host has, not NVIDIA's 195).
func (p *plugin) major() uint32 {
	p.t.Helper()
	dn, err := linux.StatDevice(filepath.Join(p.devRoot, "dev", "nvidia0"))
	if err != nil {
		p.t.Fatal(err)
	}
	return dn.Major
}

// rss is the plugin's resident and peak memory in KiB.
func (p *plugin) rss() (rss, hwm int) {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) >= 2 && f[0] == "VmRSS:" {
			rss, _ = strconv.Atoi(f[1])
		}
		if len(f) >= 2 && f[0] == "VmHWM:" {
			hwm, _ = strconv.Atoi(f[1])
		}
	}
	return rss, hwm
}

// allocatable is the Node's allocatable count of resource.
func allocatable(t *testing.T, c *cluster.Cluster, resource corev1.ResourceName) int64 {
	t.Helper()
	n, err := c.Client.CoreV1().Nodes().Get(t.Context(), cluster.NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	q, ok := n.Status.Allocatable[resource]
	if !ok {
		return -1
	}
	return q.Value()
}

// sliceDevices lists the devices the cluster's ResourceSlices of the driver
// publish for the node.
func sliceDevices(t *testing.T, c *cluster.Cluster) []string {
	t.Helper()
	l, err := c.Client.ResourceV1().ResourceSlices().List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, s := range l.Items {
		if s.Spec.Driver != driver || s.Spec.NodeName == nil || *s.Spec.NodeName != cluster.NodeName {
			continue
		}
		for _, d := range s.Spec.Devices {
			out = append(out, d.Name)
		}
	}
	slices.Sort(out)
	return out
}

const driver = "gpu.gpuiso.io"

// isolationArgs make the probe report what the pod sees of the GPUs: the
// device nodes in /dev, a read-write open of a node it makes itself for
// each minor of minors on the GPUs' major (ENXIO: the cgroup allows it;
// EPERM: denied), the environment naming the devices, then "cwd /" (the
// end), then it sleeps when keep. extra is one more step, before the end.
func isolationArgs(major uint32, minors []int, keep bool, extra ...string) []string {
	args := []string{"do", "ls", "/dev"}
	for _, m := range minors {
		args = append(args, "--", "mknod", fmt.Sprintf("/dev/gpuiso-m%d", m), strconv.Itoa(int(major)), strconv.Itoa(m), "open")
	}
	args = append(args, "--", "env", "NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
	if len(extra) > 0 {
		args = append(append(args, "--"), extra...)
	}
	args = append(args, "--", "cwd")
	if keep {
		args = append(args, "--", "sleep", "100000")
	}
	return args
}

// seen is what the probe reported.
type seen struct {
	nodes []string       // /dev/nvidia<N> names
	open  map[int]string // minor: result of opening a self-made node
	env   map[string]string
}

var gpuNode = regexp.MustCompile(`^nvidia[0-9]+$`)

func parseSeen(out string) seen {
	s := seen{open: map[int]string{}, env: map[string]string{}}
	made := map[string]bool{}
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) == 1 && gpuNode.MatchString(f[0]):
			s.nodes = append(s.nodes, f[0])
		case len(f) >= 2 && strings.HasPrefix(f[0], "/dev/gpuiso-m"):
			if !made[f[0]] {
				made[f[0]] = true // the mknod's line ("file exists" the second time); the open's follows
				continue
			}
			m, _ := strconv.Atoi(strings.TrimPrefix(f[0], "/dev/gpuiso-m"))
			s.open[m] = strings.Join(f[1:], " ")
		case len(f) == 1 && strings.Contains(f[0], "="):
			k, v, _ := strings.Cut(f[0], "=")
			s.env[k] = v
		}
	}
	slices.Sort(s.nodes)
	return s
}

// check compares what a pod saw with the devices it should have: exactly
// the GPU nodes of minors, only they open, and NVIDIA_VISIBLE_DEVICES names
// exactly uuids.
func (s seen) check(t *testing.T, allMinors, minors []int, uuids []string) {
	t.Helper()
	var want []string
	for _, m := range minors {
		want = append(want, fmt.Sprintf("nvidia%d", m))
	}
	slices.Sort(want)
	if !slices.Equal(s.nodes, want) {
		t.Errorf("GPU nodes in the pod's /dev: %v, want %v", s.nodes, want)
	}
	for _, m := range allMinors {
		want := "EPERM"
		if slices.Contains(minors, m) {
			want = "ENXIO"
		}
		if s.open[m] != want {
			t.Errorf("open of a self-made node for minor %d: %q, want %s (the device cgroup %s it)", m, s.open[m], want,
				map[string]string{"EPERM": "denies", "ENXIO": "allows"}[want])
		}
	}
	got := strings.Split(s.env["NVIDIA_VISIBLE_DEVICES"], ",")
	if s.env["NVIDIA_VISIBLE_DEVICES"] == "" {
		got = nil
	}
	slices.Sort(got)
	want = slices.Clone(uuids)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("NVIDIA_VISIBLE_DEVICES=%q, want %v", s.env["NVIDIA_VISIBLE_DEVICES"], want)
	}
}

// probePod is a pod running the probe with args on the host's network.
func probePod(name string, args []string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever, HostNetwork: true, AutomountServiceAccountToken: ptr.To(false),
			TerminationGracePeriodSeconds: ptr.To(int64(1)),
			Containers:                    []corev1.Container{{Name: "main", Image: probeImage, ImagePullPolicy: corev1.PullNever, Args: args}},
		},
	}
}

// withGPUs asks for n of resource through the device plugin.
func withGPUs(p *corev1.Pod, resource string, n int64) *corev1.Pod {
	q := *resourceQuantity(n)
	p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{corev1.ResourceName(resource): q}
	return p
}

// withClaim gives the pod a claim made from template.
func withClaim(p *corev1.Pod, template string) *corev1.Pod {
	p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpus", ResourceClaimTemplateName: ptr.To(template)}}
	p.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpus"}}
	return p
}

// createPod creates p; it is deleted when t ends (before the plugin
// stops).
func createPod(t *testing.T, c *cluster.Cluster, p *corev1.Pod) {
	t.Helper()
	if _, err := c.Client.CoreV1().Pods(p.Namespace).Create(t.Context(), p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deletePod(t, c, p.Name) })
}

// deletePod deletes the pod and waits until it is gone.
func deletePod(t *testing.T, c *cluster.Cluster, name string) {
	t.Helper()
	ctx := context.Background()
	err := c.Client.CoreV1().Pods("default").Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(1))})
	if apierrors.IsNotFound(err) {
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	until(t, "pod "+name+" to be gone", func() bool {
		_, err := c.Client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
}

// podOutput waits until the pod's probe has reported (its "cwd" line) and
// returns its output.
func podOutput(t *testing.T, c *cluster.Cluster, name string) string {
	t.Helper()
	var out string
	until(t, "pod "+name+"'s output", func() bool {
		p, err := c.Client.CoreV1().Pods("default").Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Status.Phase == corev1.PodFailed {
			t.Fatalf("pod %s failed: %+v", name, p.Status)
		}
		if p.Status.Phase != corev1.PodRunning && p.Status.Phase != corev1.PodSucceeded {
			return false
		}
		b, err := c.Client.CoreV1().Pods("default").GetLogs(name, &corev1.PodLogOptions{}).DoRaw(t.Context())
		out = string(b)
		return err == nil && strings.Contains(out, "cwd /")
	})
	return out
}

// pod returns the pod called name.
func pod(t *testing.T, c *cluster.Cluster, name string) *corev1.Pod {
	t.Helper()
	p, err := c.Client.CoreV1().Pods("default").Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// unschedulable reports whether the scheduler found no room for the pod.
func unschedulable(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return true
		}
	}
	return false
}

// claimOf is the ResourceClaim made for the pod's one claim.
func claimOf(t *testing.T, c *cluster.Cluster, podName string) *resourceapi.ResourceClaim {
	t.Helper()
	var name string
	until(t, "pod "+podName+"'s claim", func() bool {
		p := pod(t, c, podName)
		for _, s := range p.Status.ResourceClaimStatuses {
			if s.ResourceClaimName != nil {
				name = *s.ResourceClaimName
				return true
			}
		}
		return false
	})
	claim, err := c.Client.ResourceV1().ResourceClaims("default").Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return claim
}

// minorsOf maps the inventory's GPUs: UUID to minor, and every minor.
func minorsOf(inv *node.Inventory) (map[string]int, []int) {
	byUUID := map[string]int{}
	var all []int
	for _, d := range inv.Devices {
		byUUID[d.UUID] = int(d.Minor)
		all = append(all, int(d.Minor))
	}
	return byUUID, all
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
