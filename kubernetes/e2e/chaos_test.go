package e2e

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/isolator/mps"
	"github.com/gpuiso/gpuiso/kubernetes/internal/cluster"
)

// chaosWaves is the soak's length: the waves of claim pods TestChaos runs
// (each about 16 pods over the three nodes; four by default, in make
// test). go test -run TestChaos -chaos-waves 40 soaks longer.
var chaosWaves = flag.Int("chaos-waves", 4, "TestChaos: waves of claim pods (about 16 each); the plugins are killed in every wave, a node reboots after the second, the chart is upgraded during the third")

// chaosPod is what a soak pod reported from inside: the GPUs and MIG
// devices its claim gave it.
type chaosPod struct {
	name, node string
	devices    []string // NVIDIA_VISIBLE_DEVICES
}

// chaosSampler watches the soak's running pods: at every sample, no GPU or
// MIG device may be in two of them.
type chaosSampler struct {
	c        *cluster.Cluster
	mu       sync.Mutex
	seen     map[string]chaosPod // pods whose output was read: they ran
	samples  int
	overlaps []string
}

func (s *chaosSampler) sample(ctx context.Context) {
	l, err := s.c.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "gpuiso.io/soak=true"})
	if err != nil {
		return
	}
	holder := map[string]string{}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.samples++
	for _, p := range l.Items {
		if p.Status.Phase != corev1.PodRunning {
			continue
		}
		cp, ok := s.seen[p.Name]
		if !ok {
			b, err := s.c.Client.CoreV1().Pods("default").GetLogs(p.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
			if err != nil || !strings.Contains(string(b), "cwd /") {
				continue
			}
			cp = chaosPod{name: p.Name, node: p.Spec.NodeName}
			if env := parseSeen(string(b)).env["NVIDIA_VISIBLE_DEVICES"]; env != "" {
				cp.devices = strings.Split(env, ",")
			}
			s.seen[p.Name] = cp
		}
		for _, d := range cp.devices {
			if other, ok := holder[d]; ok {
				s.overlaps = append(s.overlaps, fmt.Sprintf("%s in running pods %s and %s", d, other, p.Name))
			}
			holder[d] = p.Name
		}
	}
}

// TestChaos soaks the Helm-installed plugin: waves of claim pods (whole
// GPUs on the V100 and A100 nodes, MIG devices on the H100 node) are made
// and deleted while each node's plugin is SIGKILLed at random moments, a
// node reboots once and the chart is upgraded once. Throughout, samples of
// the running pods (their devices as each reported them from inside) never
// show a GPU or MIG device in two; every pod runs; after the last pod is
// gone no node has an allocation, an MPS daemon or a claim's CDI spec left.
func TestChaos(t *testing.T) {
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
	values := installValues(t, c, freeMetricsPort(t, c))
	if out, err := h.run(ctx, append([]string{"install", release, chartDir, "--namespace", "default", "--wait", "--timeout", "3m"}, values...)...); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	h.uninstallAtEnd(t, c, nil)
	until(t, "the DaemonSet on every node", func() bool { return daemonSetRolled(t, c) })
	until(t, "every node's slice", func() bool { return publishedAsWanted(t, c) })
	templateIn(t, c, "default", "soak-gpu", "gpu.gpuiso.io", 1, "")
	templateIn(t, c, "default", "soak-mig", "mig.gpuiso.io", 1, "")

	s := &chaosSampler{c: c, seen: map[string]chaosPod{}}
	sctx, stopSampling := context.WithCancel(ctx)
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for sctx.Err() == nil {
			s.sample(sctx)
			select {
			case <-sctx.Done():
			case <-time.After(300 * time.Millisecond):
			}
		}
	}()
	defer func() { stopSampling(); <-sampled }()

	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	kinds := []struct {
		template, node string
		n              int
	}{{"soak-gpu", c.Nodes[0].Name, 6}, {"soak-gpu", c.Nodes[1].Name, 6}, {"soak-mig", c.Nodes[2].Name, 4}}
	var all []string
	var kills atomic.Int32
	reboots, upgrades := 0, 0
	for w := range *chaosWaves {
		var wave []string
		for _, k := range kinds {
			for i := range k.n {
				name := fmt.Sprintf("soak-%d-%s-%d", w, strings.ReplaceAll(k.node, ".", "-"), i)
				secs := fmt.Sprintf("%.1f", 2+3*rng.Float64())
				p := onNode(in("default", withClaim(probePod(name, []string{"do", "env", "NVIDIA_VISIBLE_DEVICES", "--", "cwd", "--", "sleep", secs}), k.template)), k.node)
				p.Labels = map[string]string{"gpuiso.io/soak": "true"}
				createIn(t, c, p)
				wave = append(wave, name)
			}
		}
		all = append(all, wave...)
		// Each node's plugin dies at a random moment of the wave.
		var kill sync.WaitGroup
		for _, n := range c.Nodes {
			after := time.Duration(rng.IntN(3000)) * time.Millisecond
			kill.Go(func() {
				time.Sleep(after)
				for _, pid := range procsOf("gpuiso-kubelet", "--node-name="+n.Name) {
					if syscall.Kill(pid, syscall.SIGKILL) == nil {
						kills.Add(1)
					}
				}
			})
		}
		if w == 2 {
			if _, err := h.run(ctx, "upgrade", release, chartDir, "--namespace", "default", "--wait", "--timeout", "3m",
				"--reuse-values", "--set", fmt.Sprintf("podAnnotations.soak=wave-%d", w)); err != nil {
				t.Fatal(err)
			}
			upgrades++
		}
		kill.Wait()
		for _, name := range wave {
			until(t, "soak pod "+name+" to end", func() bool {
				p := pod(t, c, name)
				return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
			})
		}
		for _, name := range wave {
			if p := pod(t, c, name); p.Status.Phase != corev1.PodSucceeded {
				t.Errorf("soak pod %s: %s %s", name, p.Status.Phase, p.Status.Message)
			}
			deleteIn(t, c, "default", name)
		}
		until(t, "the plugins back on every node", func() bool { return daemonSetRolled(t, c) })
		if w == 1 {
			n := c.Nodes[rng.IntN(len(c.Nodes))]
			if err := c.Reboot(ctx, n); err != nil {
				t.Fatal(err)
			}
			reboots++
			until(t, "the plugins back after the reboot", func() bool { return daemonSetRolled(t, c) })
		}
	}
	stopSampling()
	<-sampled

	ran := 0
	for _, name := range all {
		if _, ok := s.seen[name]; ok {
			ran++
		} else {
			t.Errorf("soak pod %s was never seen running with its devices", name)
		}
	}
	for _, o := range s.overlaps {
		t.Error("a device in two running pods: " + o)
	}
	until(t, "every claim's state to go", func() bool { return len(chaosLeftovers(t, c)) == 0 })
	t.Logf("soak: %d waves, %d pods, %d ran, %d samples, %d plugin kills, %d reboots, %d upgrades, devices seen in two pods: %d, leftovers: %d",
		*chaosWaves, len(all), ran, s.samples, kills.Load(), reboots, upgrades, len(s.overlaps), len(chaosLeftovers(t, c)))
}

// chaosLeftovers lists what claims left on the nodes: allocations in the
// plugin's allocator state, MPS daemons, claims' CDI specs and
// checkpoints.
func chaosLeftovers(t *testing.T, c *cluster.Cluster) []string {
	t.Helper()
	var out []string
	for _, n := range c.Nodes {
		holdings, err := allocator.ReadHoldings(filepath.Join(n.StateDir, "allocator"))
		if err != nil {
			out = append(out, fmt.Sprintf("%s: allocator state: %v", n.Name, err))
		}
		for _, h := range holdings {
			out = append(out, fmt.Sprintf("%s: allocation of %s", n.Name, h.Owner))
		}
		ds, err := mps.Daemons(t.Context(), filepath.Join(n.StateDir, "mps"))
		if err != nil {
			out = append(out, fmt.Sprintf("%s: MPS daemons: %v", n.Name, err))
		}
		for _, d := range ds {
			out = append(out, fmt.Sprintf("%s: MPS daemon of %s", n.Name, d.Owner))
		}
		entries, _ := os.ReadDir(n.CDIDir)
		for _, e := range entries {
			if strings.Contains(e.Name(), "claim") {
				out = append(out, filepath.Join(n.CDIDir, e.Name()))
			}
		}
		checkpoints, _ := filepath.Glob(filepath.Join(n.StateDir, "claims", "*.json"))
		out = append(out, checkpoints...)
	}
	return out
}
