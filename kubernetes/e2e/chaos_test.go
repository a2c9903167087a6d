package e2e

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/isolator/mps"
	"github.com/gpuiso/gpuiso/kubernetes/internal/cluster"
)

// chaosWaves is the soak's length: the waves of claim pods TestChaos runs
// (each 22 pods over the three nodes, 13 of them shares; four by
// default, in make test). go test -run TestChaos -chaos-waves 40 soaks
// longer.
var chaosWaves = flag.Int("chaos-waves", 4, "TestChaos: waves of claim pods (22 each); the plugins are killed in every wave, a node reboots after the second, the chart is upgraded during the third")

// chaosPod is what a soak pod reported from inside: the GPUs and MIG
// devices its claim gave it and, for a share (kind, its label), the MPS
// pipe directory and memory limit its environment holds.
type chaosPod struct {
	name, node string
	kind       string   // "" for a device of its own
	devices    []string // NVIDIA_VISIBLE_DEVICES
	pipe       bool     // CUDA_MPS_PIPE_DIRECTORY set
	limitMiB   int64    // CUDA_MPS_PINNED_DEVICE_MEM_LIMIT
}

// chaosSampler watches the soak's running pods: at every sample, no GPU or
// MIG device of a pod's own may be in another running pod; the running
// shares of a GPU are all of one kind (memory shares, time slices, or
// concurrent slices of one count), and they fit in it: their memory limits
// within its memory, no more time slices than the chart's, no more
// concurrent slices than their count. Each share pod's environment is
// checked once against its kind: a memory share's limit is its request,
// a concurrent slice's the GPU's memory over the count, a time slice has
// no MPS daemon.
type chaosSampler struct {
	c        *cluster.Cluster
	capacity map[string]map[string]int64 // share devices' MiB by node and GPU
	requests map[string]int64            // a memory share's MiB by its pod's template
	mu       sync.Mutex
	seen     map[string]chaosPod // pods whose output was read: they ran
	samples  int
	overlaps []string
	wrong    []string
	shared   int // samples that found a GPU shared by two running pods or more
}

func (s *chaosSampler) sample(ctx context.Context) {
	l, err := s.c.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "gpuiso.io/soak=true"})
	if err != nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.samples++
	var run []chaosPod
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
			env := parseSeen(string(b)).env
			cp = chaosPod{name: p.Name, node: p.Spec.NodeName, kind: p.Labels[shareLabel],
				pipe: env["CUDA_MPS_PIPE_DIRECTORY"] != "", limitMiB: mpsLimitMiB(env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"])}
			if env := env["NVIDIA_VISIBLE_DEVICES"]; env != "" {
				cp.devices = strings.Split(env, ",")
			}
			s.seen[p.Name] = cp
			s.checkShare(cp, p.Spec.ResourceClaims[0].ResourceClaimTemplateName)
		}
		run = append(run, cp)
	}
	overlaps, shared := overlapsOf(run, s.capacity)
	s.overlaps = append(s.overlaps, overlaps...)
	if shared {
		s.shared++
	}
}

// overlapsOf checks the pods running at one moment: a device of a pod's
// own (a GPU, a MIG device) in no other pod; the shares of a GPU all of
// one kind, in no pod that has the GPU as its own, and within what it
// holds (capacity: the GPU's MiB by node and UUID): the memory shares'
// limits within its memory, the time slices within the chart's count,
// the concurrent slices within theirs. shared tells whether two pods or
// more shared a GPU.
func overlapsOf(run []chaosPod, capacity map[string]map[string]int64) (overlaps []string, shared bool) {
	holder := map[string]string{}     // node/device: the pod that holds it as its own
	shares := map[string][]chaosPod{} // node/GPU: its running shares
	for _, p := range run {
		for _, d := range p.devices {
			key := p.node + "/" + d
			if p.kind != "" {
				shares[key] = append(shares[key], p)
				continue
			}
			if other, ok := holder[key]; ok {
				overlaps = append(overlaps, fmt.Sprintf("%s in running pods %s and %s", d, other, p.name))
			}
			holder[key] = p.name
		}
	}
	for key, pods := range shares {
		gpu := key[strings.Index(key, "/")+1:]
		names := make([]string, len(pods))
		var mem int64
		kinds := map[string]bool{}
		for i, p := range pods {
			names[i] = p.name + " (" + p.kind + ")"
			mem += p.limitMiB
			kinds[p.kind] = true
		}
		slices.Sort(names)
		if len(kinds) > 1 {
			overlaps = append(overlaps, fmt.Sprintf("%s has shares of two kinds in running pods %v", gpu, names))
		}
		if other, ok := holder[key]; ok {
			overlaps = append(overlaps, fmt.Sprintf("%s is pod %s's own and shared by running pods %v", gpu, other, names))
		}
		shared = shared || len(pods) > 1
		capa := capacity[pods[0].node][gpu]
		switch k := pods[0].kind; {
		case len(kinds) > 1:
		case k == memoryShare && mem > capa:
			overlaps = append(overlaps, fmt.Sprintf("%s's %d MiB shared by %d MiB of running pods %v", gpu, capa, mem, names))
		case k == timeSlice && len(pods) > chartTimeSlices:
			overlaps = append(overlaps, fmt.Sprintf("%s's %d time slices held by running pods %v", gpu, chartTimeSlices, names))
		case strings.HasPrefix(k, slicePrefix) && len(pods) > (shareLoad{kind: k}).slices():
			overlaps = append(overlaps, fmt.Sprintf("%s split in %s held by running pods %v", gpu, k, names))
		}
	}
	slices.Sort(overlaps)
	return overlaps, shared
}

// TestChaosOverlaps: the soak's check of one sample finds each overlap
// of running pods, and none where shares of a GPU fit.
func TestChaosOverlaps(t *testing.T) {
	capacity := map[string]map[string]int64{"n1": {"GPU-4": 16384, "GPU-5": 16384}, "n2": {"GPU-4": 40960}}
	own := func(name, node string, devices ...string) chaosPod {
		return chaosPod{name: name, node: node, devices: devices}
	}
	share := func(name, node, kind, gpu string, mib int64) chaosPod {
		return chaosPod{name: name, node: node, kind: kind, devices: []string{gpu}, pipe: mib > 0, limitMiB: mib}
	}
	mem := func(name string, mib int64) chaosPod { return share(name, "n1", memoryShare, "GPU-4", mib) }
	ts := func(name string) chaosPod { return share(name, "n1", timeSlice, "GPU-4", 0) }
	sl := func(name string, n int) chaosPod { return share(name, "n1", sliceKind(n), "GPU-4", 16384/int64(n)) }
	for _, tc := range []struct {
		name   string
		run    []chaosPod
		want   []string
		shared bool
	}{
		{"devices of their own", []chaosPod{own("a", "n1", "GPU-1"), own("b", "n1", "GPU-2", "GPU-3"), own("c", "n2", "GPU-1")}, nil, false},
		{"a GPU in two pods", []chaosPod{own("a", "n1", "GPU-1"), own("b", "n1", "GPU-2", "GPU-1")},
			[]string{"GPU-1 in running pods a and b"}, false},
		{"memory shares that fit", []chaosPod{mem("a", 8192), mem("b", 4096), mem("c", 4096), share("d", "n2", memoryShare, "GPU-4", 20480)}, nil, true},
		{"memory shares past the GPU's memory", []chaosPod{mem("a", 8192), mem("b", 4096), mem("c", 6144)},
			[]string{"GPU-4's 16384 MiB shared by 18432 MiB of running pods [a (memory) b (memory) c (memory)]"}, true},
		{"time slices that fit", []chaosPod{ts("a"), ts("b"), ts("c"), ts("d")}, nil, true},
		{"a time slice too many", []chaosPod{ts("a"), ts("b"), ts("c"), ts("d"), ts("e")},
			[]string{"GPU-4's 4 time slices held by running pods [a (time) b (time) c (time) d (time) e (time)]"}, true},
		{"concurrent slices that fit", []chaosPod{sl("a", 2), sl("b", 2)}, nil, true},
		{"a concurrent slice too many", []chaosPod{sl("a", 2), sl("b", 2), sl("c", 2)},
			[]string{"GPU-4 split in slices-2 held by running pods [a (slices-2) b (slices-2) c (slices-2)]"}, true},
		{"slices of two counts", []chaosPod{sl("a", 2), sl("b", 4)},
			[]string{"GPU-4 has shares of two kinds in running pods [a (slices-2) b (slices-4)]"}, true},
		{"a memory share beside a time slice", []chaosPod{mem("a", 2048), ts("b")},
			[]string{"GPU-4 has shares of two kinds in running pods [a (memory) b (time)]"}, true},
		{"a GPU of a pod's own shared", []chaosPod{own("a", "n1", "GPU-4"), mem("b", 2048)},
			[]string{"GPU-4 is pod a's own and shared by running pods [b (memory)]"}, false},
		{"shares of two GPUs", []chaosPod{mem("a", 2048), share("b", "n1", timeSlice, "GPU-5", 0)}, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, shared := overlapsOf(tc.run, capacity)
			if !slices.Equal(got, tc.want) || shared != tc.shared {
				t.Errorf("overlaps %q, shared %v; want %q, %v", got, shared, tc.want, tc.shared)
			}
		})
	}
}

// checkShare compares what a share's pod saw of its MPS daemon with its
// kind (s.mu held).
func (s *chaosSampler) checkShare(p chaosPod, template *string) {
	if p.kind == "" {
		return
	}
	if len(p.devices) != 1 {
		s.wrong = append(s.wrong, fmt.Sprintf("share pod %s sees devices %v, want its GPU", p.name, p.devices))
		return
	}
	var want int64 // MiB
	switch l := (shareLoad{kind: p.kind}); {
	case p.kind == memoryShare && template != nil:
		want = s.requests[*template]
	case l.slices() > 0:
		want = s.capacity[p.node][p.devices[0]] / int64(l.slices())
	}
	if p.pipe != (want > 0) || p.limitMiB != want {
		s.wrong = append(s.wrong, fmt.Sprintf("share pod %s (%s): MPS pipe directory %v, limit %d MiB; want %d MiB", p.name, p.kind, p.pipe, p.limitMiB, want))
	}
}

// chaosKind is a kind of soak pod: n pods of each wave on node, of the
// claim template of the wave's turn in templates.
type chaosKind struct {
	node      string
	n         int
	templates []string
}

// TestChaos soaks the Helm-installed plugin, which shares GPUs 4, 5 and 6
// of every node (sharedGPUs): waves of claim pods are made and deleted
// while each node's plugin is SIGKILLed at random moments, a node reboots
// once and the chart is upgraded once. A wave has pods of whole GPUs on
// the V100 and A100 nodes and of MIG devices on the H100 node; on the
// V100 node memory shares of 2 GiB of GPU 4, concurrent slices of 4 of
// GPU 5 (one more pod than fit: it waits for a slice) and time slices of
// GPU 6; on the A100 node shares of GPU 6 whose kind changes from wave to
// wave (time slices, concurrent slices of 2, memory shares of 8 GiB), so
// that the GPU goes from one kind to another. Throughout, samples of the
// running pods (their devices as each reported them from inside) never
// show a GPU or MIG device of a pod's own in another pod, nor a GPU with
// shares of two kinds or more shares than it holds (chaosSampler); every
// pod runs; after the last pod is gone no node has an allocation, an MPS
// daemon (its record, processes, directories, cgroup or mounts) or a
// claim's CDI spec left.
func TestChaos(t *testing.T) {
	c := requireCluster(t)
	h := requireHelm(t, c)
	testenv.RequireSimulatedMPS(t)
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
	values := append(installValues(t, c, freeMetricsPort(t, c)), sharedGPUs...)
	if out, err := h.run(ctx, append([]string{"install", release, chartDir, "--namespace", "default", "--wait", "--timeout", "3m"}, values...)...); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	h.uninstallAtEnd(t, c, nil)
	until(t, "the DaemonSet on every node", func() bool { return daemonSetRolled(t, c) })
	until(t, "every node's slice", func() bool { return publishedAsWanted(t, c) })
	templateIn(t, c, "default", "soak-gpu", "gpu.gpuiso.io", 1, "")
	templateIn(t, c, "default", "soak-mig", "mig.gpuiso.io", 1, "")
	// The V100's GPUs have 16 GiB, the A100's 40 GiB: a time slice or a
	// concurrent slice asks for its part, so that no more fit.
	loads := map[string]shareLoad{}
	requests := map[string]int64{}
	for _, l := range []shareLoad{
		{template: "soak-mem", gpu: 4, kind: memoryShare, memory: "2Gi"},
		{template: "soak-slice", gpu: 5, kind: sliceKind(4), memory: "4Gi"},
		{template: "soak-time", gpu: 6, kind: timeSlice, memory: "4Gi"},
		{template: "soak-turn-time", gpu: 6, kind: timeSlice, memory: "10Gi"},
		{template: "soak-turn-slice", gpu: 6, kind: sliceKind(2), memory: "20Gi"},
		{template: "soak-turn-mem", gpu: 6, kind: memoryShare, memory: "8Gi"},
	} {
		l.make(t, c)
		loads[l.template] = l
		if l.kind == memoryShare {
			q := resource.MustParse(l.memory)
			requests[l.template] = q.Value() >> 20
		}
	}
	volta, a100, h100 := c.Nodes[0].Name, c.Nodes[1].Name, c.Nodes[2].Name
	kinds := []chaosKind{
		{volta, 3, []string{"soak-gpu"}}, {a100, 3, []string{"soak-gpu"}}, {h100, 3, []string{"soak-mig"}},
		{volta, 4, []string{"soak-mem"}}, {volta, 5, []string{"soak-slice"}}, {volta, 2, []string{"soak-time"}},
		{a100, 2, []string{"soak-turn-time", "soak-turn-slice", "soak-turn-mem"}},
	}

	s := &chaosSampler{c: c, seen: map[string]chaosPod{}, capacity: shareCapacity(t, c), requests: requests}
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

	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	var all []string
	perKind := map[string]int{}
	var kills atomic.Int32
	reboots, upgrades := 0, 0
	start := time.Now()
	for w := range *chaosWaves {
		var wave []string
		waveStart := time.Now()
		for ki, k := range kinds {
			tmpl := k.templates[w%len(k.templates)]
			for i := range k.n {
				name := fmt.Sprintf("soak-%d-%s-%d-%d", w, strings.ReplaceAll(k.node, ".", "-"), ki, i)
				secs := fmt.Sprintf("%.1f", 2+3*rng.Float64())
				p := onNode(in("default", withClaim(probePod(name, []string{"do", "env", "NVIDIA_VISIBLE_DEVICES", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
					"--", "cwd", "--", "sleep", secs}), tmpl)), k.node)
				p.Labels = map[string]string{"gpuiso.io/soak": "true"}
				if l, ok := loads[tmpl]; ok {
					p.Labels[shareLabel] = l.kind
				}
				createIn(t, c, p)
				wave = append(wave, name)
				perKind[tmpl+" on "+k.node]++
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
		ended := time.Since(waveStart)
		// Deleted all at once, then waited for.
		for _, name := range wave {
			if p := pod(t, c, name); p.Status.Phase != corev1.PodSucceeded {
				t.Errorf("soak pod %s: %s %s", name, p.Status.Phase, p.Status.Message)
			}
			err := c.Client.CoreV1().Pods("default").Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(1))})
			if err != nil && !apierrors.IsNotFound(err) {
				t.Fatal(err)
			}
		}
		until(t, "the wave's pods to be gone", func() bool {
			l, err := c.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "gpuiso.io/soak=true"})
			return err == nil && len(l.Items) == 0
		})
		gone := time.Since(waveStart)
		until(t, "the plugins back on every node", func() bool { return daemonSetRolled(t, c) })
		r := func(d time.Duration) time.Duration { return d.Round(100 * time.Millisecond) }
		t.Logf("wave %d: %d pods ran to their end in %v, were gone in %v, the plugins back in %v", w, len(wave), r(ended), r(gone), r(time.Since(waveStart)))
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
	waves := time.Since(start)

	ran := 0
	for _, name := range all {
		if _, ok := s.seen[name]; ok {
			ran++
		} else {
			t.Errorf("soak pod %s was never seen running with its devices", name)
		}
	}
	for _, o := range s.overlaps {
		t.Error("running pods overlap: " + o)
	}
	for _, w := range s.wrong {
		t.Error(w)
	}
	var left []string
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if left = chaosLeftovers(t, c); len(left) == 0 {
			break
		}
	}
	for _, l := range left {
		t.Error("left after every pod: " + l)
	}
	t.Logf("soak: %d waves in %v, %d pods (%v), %d ran, %d samples (%d with a GPU shared by running pods), %d plugin kills, %d reboots, %d upgrades, overlaps: %d, wrong shares: %d, leftovers: %d",
		*chaosWaves, waves.Round(time.Second), len(all), perKind, ran, s.samples, s.shared, kills.Load(), reboots, upgrades, len(s.overlaps), len(s.wrong), len(left))
}

// chaosLeftovers lists what claims left on the nodes: allocations in the
// plugin's allocator state, MPS daemons (recorded, or their processes,
// directories, cgroups and mounts: mpsLeftovers), claims' CDI specs and
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
		out = append(out, mpsLeftovers(n)...)
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
