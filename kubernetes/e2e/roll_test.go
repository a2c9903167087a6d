package e2e

import (
	"bytes"
	"context"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/isolator/mps"
	"github.com/gpuiso/gpuiso/kubernetes/internal/cluster"
)

// pluginLogs follows the log of every plugin pod that runs while it does,
// for a failure's report: a roll's old pods are gone, their logs with them,
// by the time a test fails.
type pluginLogs struct {
	mu   sync.Mutex
	logs map[string]*bytes.Buffer
	stop context.CancelFunc
	done sync.WaitGroup
}

func followPluginLogs(t *testing.T, c *cluster.Cluster) *pluginLogs {
	ctx, cancel := context.WithCancel(context.Background())
	l := &pluginLogs{logs: map[string]*bytes.Buffer{}, stop: cancel}
	l.done.Go(func() {
		for ctx.Err() == nil {
			pods, err := c.Client.CoreV1().Pods(pluginNS).List(ctx, metav1.ListOptions{})
			if err == nil {
				for _, p := range pods.Items {
					l.mu.Lock()
					_, seen := l.logs[p.Name]
					if !seen && len(p.Status.ContainerStatuses) > 0 && p.Status.ContainerStatuses[0].State.Waiting == nil {
						b := &bytes.Buffer{}
						l.logs[p.Name] = b
						l.done.Go(func() {
							r, err := c.Client.CoreV1().Pods(pluginNS).GetLogs(p.Name, &corev1.PodLogOptions{Follow: true}).Stream(ctx)
							if err != nil {
								return
							}
							defer r.Close()
							out, _ := io.ReadAll(r)
							l.mu.Lock()
							b.Write(out)
							l.mu.Unlock()
						})
					}
					l.mu.Unlock()
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	})
	t.Cleanup(func() {
		l.stop()
		l.done.Wait()
		if t.Failed() {
			l.mu.Lock()
			defer l.mu.Unlock()
			for name, b := range l.logs {
				t.Logf("plugin pod %s:\n%s", name, tail(b.String(), 6000))
			}
			// Why a plugin pod stopped: a readiness probe that failed (the
			// DaemonSet replaces an unready pod without a surge), a kill.
			evs, err := c.Client.CoreV1().Events(pluginNS).List(context.Background(), metav1.ListOptions{})
			if err == nil {
				for _, ev := range evs.Items {
					if ev.Type != corev1.EventTypeNormal || ev.Reason == "Killing" || ev.Reason == "SuccessfulDelete" {
						t.Logf("event %s %s/%s: %s %s (%d times, last %s)", ev.Type, ev.InvolvedObject.Kind, ev.InvolvedObject.Name, ev.Reason,
							strings.TrimSpace(ev.Message), ev.Count, ev.LastTimestamp.Format(time.RFC3339))
					}
				}
			}
		}
	})
	return l
}

// TestHelmRoll rolls the Helm-installed plugin under load, as an upgrade
// does. The chart shares GPUs 4, 5 and 6 of every node (sharedGPUs).
// Pods holding a GPU, a MIG device, a memory share of 2 GiB of the
// DGX-1's GPU 4, a concurrent slice (of 4) of its GPU 5 and a time slice
// of its GPU 6 run through it, and a stream of claim pods (whole GPUs on
// the V100 and A100 nodes, MIG devices on the H100 node, memory shares on
// the V100 and A100 nodes, concurrent and time slices on the V100 node)
// is made while the DaemonSet rolls with its default surge. Not one
// prepare fails (no FailedPrepareDynamicResources event), every stream
// pod runs to its end, and the running pods keep their devices,
// unrestarted; the running shares keep their MPS daemons (the same
// processes) and the limits they hold.
func TestHelmRoll(t *testing.T) {
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
	followPluginLogs(t, c)
	until(t, "the DaemonSet on every node", func() bool { return daemonSetRolled(t, c) })
	until(t, "every node's slice", func() bool { return publishedAsWanted(t, c) })

	volta, a100, h100 := c.Nodes[0], c.Nodes[1], c.Nodes[2]
	templateIn(t, c, "default", "roll-gpu", "gpu.gpuiso.io", 1, "")
	templateIn(t, c, "default", "roll-mig", "mig.gpuiso.io", 1, "")
	// The V100's 16 GiB: 8 memory shares, 4 concurrent slices, 4 time
	// slices fit.
	for _, l := range []shareLoad{
		{template: "roll-mem", gpu: 4, kind: memoryShare, memory: "2Gi"},
		{template: "roll-slice", gpu: 5, kind: sliceKind(4), memory: "4Gi"},
		{template: "roll-time", gpu: 6, kind: timeSlice, memory: "4Gi"},
	} {
		l.make(t, c)
	}
	type keptPod struct{ template, node string }
	keep := map[string]keptPod{
		"roll-kept-gpu": {"roll-gpu", volta.Name}, "roll-kept-mig": {"roll-mig", h100.Name},
		"roll-kept-mem": {"roll-mem", volta.Name}, "roll-kept-slice": {"roll-slice", volta.Name}, "roll-kept-time": {"roll-time", volta.Name},
	}
	kept := map[string]*corev1.Pod{}
	for name, k := range keep {
		createIn(t, c, onNode(in("default", withClaim(probePod(name, []string{"do", "env", "NVIDIA_VISIBLE_DEVICES", "CUDA_MPS_PIPE_DIRECTORY", "--", "cwd", "--", "sleep", "100000"}), k.template)), k.node))
	}
	devices := map[string]string{}
	for name := range keep {
		kept[name] = running(t, c, "default", name)
		s := parseSeen(podOutput(t, c, name))
		devices[name] = s.env["NVIDIA_VISIBLE_DEVICES"]
		if pipe := s.env["CUDA_MPS_PIPE_DIRECTORY"] != ""; pipe != (name == "roll-kept-mem" || name == "roll-kept-slice") {
			t.Errorf("pod %s: an MPS pipe directory: %v", name, pipe)
		}
	}
	daemons := []keptDaemon{
		keepDaemon(t, volta, "claim-"+string(claimOf(t, c, "roll-kept-mem").UID)),
		keepDaemon(t, volta, mps.SliceOwner(devices["roll-kept-slice"])),
	}
	if daemons[1].d.Slices != 4 {
		t.Errorf("the daemon of the slices: %+v, want 4 slices", daemons[1].d)
	}
	before := pluginPods(t, c)

	stream := startStream(t, c, "default", "roll-stream", 300*time.Millisecond, []streamKind{
		{"roll-gpu", volta.Name}, {"roll-mem", volta.Name}, {"roll-mig", h100.Name}, {"roll-slice", volta.Name},
		{"roll-gpu", a100.Name}, {"roll-time", volta.Name}, {"roll-mem", a100.Name},
	})
	start := time.Now()
	if out, err := h.run(ctx, "upgrade", release, chartDir, "--namespace", "default", "--wait", "--timeout", "3m",
		"--reuse-values", "--set", "healthRefresh=3s"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	until(t, "the DaemonSet to roll", func() bool { return daemonSetRolled(t, c) })
	rolled := time.Since(start)
	n, failed := stream.check(t)
	t.Logf("helm upgrade rolled %d nodes in %v with a surge; claim pods made meanwhile: %d (%v), failed prepares: %d",
		len(c.Nodes), rolled.Round(time.Millisecond), n, stream.perKind(), failed)
	for node, p := range pluginPods(t, c) {
		if before[node].UID == p.UID {
			t.Errorf("node %s: the plugin pod %s was not replaced", node, p.Name)
		}
	}
	for name, old := range kept {
		p := pod(t, c, name)
		if p.Status.Phase != corev1.PodRunning || p.Status.ContainerStatuses[0].RestartCount != 0 ||
			p.Status.ContainerStatuses[0].ContainerID != old.Status.ContainerStatuses[0].ContainerID {
			t.Errorf("after the roll pod %s is %s, %d restarts", name, p.Status.Phase, p.Status.ContainerStatuses[0].RestartCount)
		}
		out, err := c.Kubectl(ctx, "exec", name, "--", "/probe", "env", "NVIDIA_VISIBLE_DEVICES")
		if err != nil {
			t.Fatal(err)
		}
		if got := parseSeen(out).env["NVIDIA_VISIBLE_DEVICES"]; got != devices[name] || got == "" {
			t.Errorf("pod %s: devices %q after the roll, %q before", name, got, devices[name])
		}
	}
	for _, d := range daemons {
		d.same(t, volta, "after the roll")
	}
	t.Logf("MPS daemons kept through the roll: %s's pid %d (%s), %s's pid %d (%s)",
		daemons[0].d.Owner, daemons[0].d.Pid, daemons[0].limit, daemons[1].d.Owner, daemons[1].d.Pid, daemons[1].limit)
}
