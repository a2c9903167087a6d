package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func TestInCgroup(t *testing.T) {
	tests := []struct {
		name    string
		content string
		want    bool
	}{
		{"v1 root of the cluster", "4:memory:/gpuiso-k8s-1\n0::/\n", true},
		{"v1 below it", "5:devices:/gpuiso-k8s-1/kubepods/besteffort/pod1/abc\n", true},
		{"v2 below it", "0::/gpuiso-k8s-1/kubepods\n", true},
		{"another cluster", "5:devices:/gpuiso-k8s-10/kubepods\n", false},
		{"the host", "4:memory:/process_api/x\n0::/\n", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := inCgroup(tt.content, "gpuiso-k8s-1"); got != tt.want {
				t.Errorf("inCgroup = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestZeroValue: a Cluster that Start did not return refuses every
// action, and its teardown touches nothing (an empty directory or cgroup
// name would stand for the whole host).
func TestZeroValue(t *testing.T) {
	testenv.ZeroValueSafe(t, []any{&Cluster{}, &Config{}})
	for _, c := range []*Cluster{{}, {Dir: "/", cgroupName: "gpuiso-"}, {Dir: "/var/lib/x", cgroupName: ""}} {
		if err := c.Stop(t.Context()); !errors.Is(err, ErrNotStarted) {
			t.Errorf("Stop of %+v = %v, want ErrNotStarted", c, err)
		}
		if _, err := c.Ctr(t.Context(), nil, "version"); !errors.Is(err, ErrNotStarted) {
			t.Errorf("Ctr of %+v = %v, want ErrNotStarted", c, err)
		}
		if ps, cgs := c.processes(), c.cgroupDirs(); len(ps) > 0 || len(cgs) > 0 {
			t.Errorf("%+v claims %d processes and %d cgroups", c, len(ps), len(cgs))
		}
	}
}

// TestStartRefuses: a cluster that cannot start is refused with ErrStart
// before anything is made.
func TestStartRefuses(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
	}{
		{"no binaries", Config{Bin: "/nonexistent", Pause: "/bin/true"}},
		{"no runc", Config{Runc: "/nonexistent/runc", Pause: "/bin/true"}},
		{"no pause program", Config{Bin: DefaultBin, Runc: DefaultRunc}},
		{"parent too long for shim sockets", Config{Bin: DefaultBin, Runc: DefaultRunc, Pause: "/bin/true"}},
		{"relative parent", Config{Bin: DefaultBin, Runc: DefaultRunc, Pause: "/bin/true"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.cfg.Parent = t.TempDir() // longer than MaxParent
			dir := tt.cfg.Parent
			if tt.name == "relative parent" {
				t.Chdir(dir)
				tt.cfg.Parent = "p"
			}
			if len(dir) <= MaxParent {
				t.Fatalf("temporary directory %s: not longer than %d bytes", dir, MaxParent)
			}
			if tt.cfg.Pause != "" && tt.cfg.Bin == DefaultBin && len(tt.cfg.Missing()) > 0 {
				t.Skip("the pinned binaries are not built: refused for that first")
			}
			if tt.name == "no pause program" && len(tt.cfg.Missing()) > 0 {
				t.Skip("the pinned binaries are not built: refused for that first")
			}
			c, err := Start(t.Context(), tt.cfg)
			if !errors.Is(err, ErrStart) || c != nil {
				t.Fatalf("Start = %v, %v; want ErrStart", c, err)
			}
			if entries, _ := os.ReadDir(dir); len(entries) > 0 {
				t.Errorf("Start made %v", entries)
			}
		})
	}
}

// TestCluster starts a cluster of two nodes, runs a pod on it (a probe
// image imported into containerd) to completion, reads its output through
// the API, checks that the second node registered with its label, that
// each kubelet's sysctls and its node's directories over the host paths
// stay in the node's own mount namespace, and tears everything down while
// another pod still runs: no process (shims and the pod's included),
// mount, cgroup or file of the cluster is left.
func TestCluster(t *testing.T) {
	testenv.RequireKubernetes(t, Config{}.Missing()...)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	probe, err := BuildProbe(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	sysctlsBefore := map[string]string{}
	for _, name := range sysctls {
		if b, err := os.ReadFile(filepath.Join("/proc/sys", name)); err == nil {
			sysctlsBefore[name] = string(b)
		}
	}
	hadHostPaths := map[string]bool{}
	for _, p := range HostPaths() {
		_, err = os.Stat(p)
		hadHostPaths[p] = err == nil
	}
	c, err := Start(ctx, Config{Pause: probe, PauseArgs: PauseArgs, Nodes: []NodeConfig{{}, {Labels: map[string]string{"gpuiso.test/second": "yes"}}}})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			c.Stop(context.Background())
		}
	}()
	if err := c.ImportImage(ctx, "gpuiso.test/probe:1", probe, nil); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "hello", Namespace: "default"},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever, HostNetwork: true, AutomountServiceAccountToken: ptr.To(false),
			Containers: []corev1.Container{{Name: "main", Image: "gpuiso.test/probe:1", ImagePullPolicy: corev1.PullNever,
				Args: []string{"env", "HOSTNAME"}}},
		},
	}
	if _, err := c.Client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var phase corev1.PodPhase
	for phase != corev1.PodSucceeded && phase != corev1.PodFailed {
		if ctx.Err() != nil {
			t.Fatalf("pod phase %q: %v\n%s", phase, ctx.Err(), c.Logs(3000))
		}
		time.Sleep(200 * time.Millisecond)
		p, err := c.Client.CoreV1().Pods("default").Get(ctx, "hello", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		phase = p.Status.Phase
	}
	logs, err := c.Client.CoreV1().Pods("default").GetLogs("hello", &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if phase != corev1.PodSucceeded || !strings.HasPrefix(string(logs), "HOSTNAME=") {
		t.Errorf("pod %s, output %q", phase, logs)
	}

	// A pod still runs when the cluster stops: its process, its shim,
	// its root file system's mount and its cgroups are the cluster's, and
	// Leftovers sees them until Stop.
	sleeper := pod.DeepCopy()
	sleeper.Name, sleeper.Spec.Containers[0].Args = "sleeper", []string{"sleep", "100000"}
	if _, err := c.Client.CoreV1().Pods("default").Create(ctx, sleeper, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for phase = ""; phase != corev1.PodRunning; {
		if ctx.Err() != nil {
			t.Fatalf("pod sleeper %q: %v", phase, ctx.Err())
		}
		time.Sleep(200 * time.Millisecond)
		p, err := c.Client.CoreV1().Pods("default").Get(ctx, "sleeper", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		phase = p.Status.Phase
	}
	// The second node registered with its label.
	second, err := c.Client.CoreV1().Nodes().Get(ctx, "127.0.0.2", metav1.GetOptions{})
	if err != nil || second.Labels["gpuiso.test/second"] != "yes" {
		t.Errorf("node 127.0.0.2: %v, labels %v", err, second.GetLabels())
	}
	left := strings.Join(c.Leftovers(), "\n")
	// The pod runs on either node: its root file system is mounted in
	// that node's mount namespace.
	for _, want := range []string{"containerd-shim-runc-v2", "/probe sleep 100000", "mount " + c.Dir + "/n",
		"/containerd/state/io.containerd.runtime.v2.task/k8s.io/",
		"cgroup /sys/fs/cgroup/memory/" + c.CgroupName() + "/kubepods/", "directory " + c.Dir} {
		if !strings.Contains(left, want) {
			t.Errorf("while the cluster runs, Leftovers has no %q:\n%s", want, left)
		}
	}

	// Each node's kubelet rewrites sysctls, and finds its own kubelet,
	// CDI and state directories at the host paths, in its node's mount
	// namespace only.
	for _, n := range c.Nodes {
		var kubelet *proc
		for _, p := range c.procs {
			if p.name == "kubelet-"+n.short() {
				kubelet = p
			}
		}
		mi, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", kubelet.id.Pid))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range append([]string{"/proc/sys/vm/overcommit_memory", "/proc/sys/kernel/panic", "/var/log"}, HostPaths()...) {
			if !strings.Contains(string(mi), " "+m+" ") && !strings.Contains(string(mi), " "+strings.Replace(m, "/var/run", "/run", 1)+" ") {
				t.Errorf("node %s: no mount on %s in the kubelet's mount namespace", n.Name, m)
			}
		}
		if _, err := os.Stat(filepath.Join(n.KubeletRoot, "pods")); err != nil {
			t.Errorf("node %s: the kubelet's root is not the node's: %v", n.Name, err)
		}
	}
	for name, before := range sysctlsBefore {
		if now, _ := os.ReadFile(filepath.Join("/proc/sys", name)); string(now) != before {
			t.Errorf("host's %s: %q, %q before the cluster", name, now, before)
		}
	}

	stopped = true
	if err := c.Stop(ctx); err != nil {
		t.Errorf("stop: %v", err)
	}
	if left := c.Leftovers(); len(left) > 0 {
		t.Errorf("left after Stop:\n%s", strings.Join(left, "\n"))
	}
	if _, err := os.Stat(c.Dir); !os.IsNotExist(err) {
		t.Errorf("directory %s: %v", c.Dir, err)
	}
	for p, had := range hadHostPaths {
		if !had && !otherClusters(DefaultParent) {
			if _, err := os.Stat(p); !os.IsNotExist(err) {
				t.Errorf("%s, made for the nodes, is left: %v", p, err)
			}
		}
	}
}
