package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/kubernetes/internal/cluster"
)

// previousRelease is the commit of the release before this one: the one a
// `helm rollback` returns to, whose plugin must read what this release
// writes on the nodes.
const previousRelease = "6642b4c"

// previous is the previous release: its chart (in a worktree of the
// repository at previousRelease) and its plugin, built.
type previous struct {
	chart, bin string
}

// buildPrevious checks out previousRelease in a temporary worktree and
// builds its plugin as TestMain builds this one's. The worktree is removed
// when t ends. Where the repository lacks the commit (a shallow clone), t
// is skipped, or fails when the Kubernetes suite is required.
func buildPrevious(t *testing.T) previous {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("git", "-C", root, "rev-parse", "--verify", "--quiet", previousRelease+"^{commit}").CombinedOutput(); err != nil {
		msg := fmt.Sprintf("the previous release's commit %s is not in the repository (a shallow clone?): %v %s", previousRelease, err, out)
		if testenv.Required(testenv.Kubernetes) {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	dir := filepath.Join(t.TempDir(), "previous")
	if out, err := exec.Command("git", "-C", root, "worktree", "add", "--detach", dir, previousRelease).CombinedOutput(); err != nil {
		t.Fatalf("git worktree add %s: %v\n%s", previousRelease, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("git", "-C", root, "worktree", "remove", "--force", dir).CombinedOutput(); err != nil {
			t.Errorf("git worktree remove: %v\n%s", err, out)
		}
	})
	bin := filepath.Join(filepath.Dir(dir), "gpuiso-kubelet-plugin")
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	cmd := exec.CommandContext(ctx, "go", "build", "-buildvcs=false", "-ldflags=-s -w", "-o", bin, "./cmd/gpuiso-kubelet-plugin")
	cmd.Dir = filepath.Join(dir, "kubernetes")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the plugin of %s: %v\n%s", previousRelease, err, out)
	}
	t.Logf("built the plugin of %s in %v", previousRelease, time.Since(start).Round(time.Millisecond))
	return previous{chart: filepath.Join(dir, "kubernetes", "deploy", "gpuiso"), bin: bin}
}

// TestHelmRollback rolls the chart back to the previous release and
// forward again with nothing drained: the previous release installed
// (its chart, its plugin's image), pods prepared by it, `helm upgrade` to
// this release, more pods prepared by it, `helm rollback` to the previous
// release, which unprepares claims this one prepared and prepares new
// ones, then `helm upgrade` again. Through every roll each pod keeps
// running, unrestarted, and a new claim of each kind (a GPU, a MIG
// device) runs; at the end the uninstall leaves nothing on the nodes.
func TestHelmRollback(t *testing.T) {
	c := requireCluster(t)
	h := requireHelm(t, c)
	ctx := t.Context()
	prev := buildPrevious(t)
	image := pluginImage(t)
	repo, tag, _ := strings.Cut(image[strings.LastIndex(image, "/")+1:], ":")
	prevImage := strings.TrimSuffix(image, repo+":"+tag) + repo + ":prev"
	for ref, bin := range map[string]string{image: pluginBin, prevImage: prev.bin} {
		archive, err := cluster.PluginImageArchive(ref, bin)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.ImportArchive(ctx, nil, ref, archive); err != nil {
			t.Fatal(err)
		}
	}
	clearForInstall(t, c)
	values := installValues(t, c, freeMetricsPort(t, c))
	start := time.Now()
	if out, err := h.run(ctx, append([]string{"install", release, prev.chart, "--namespace", "default", "--wait", "--timeout", "3m",
		"--set", "image.tag=prev"}, values...)...); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	uninstalled := false
	h.uninstallAtEnd(t, c, &uninstalled)
	followPluginLogs(t, c)
	settled := func(what, tag string) {
		t.Helper()
		until(t, "the DaemonSet to roll ("+what+")", func() bool { return daemonSetRolled(t, c) })
		for node, p := range pluginPods(t, c) {
			if got := p.Spec.Containers[0].Image; !strings.HasSuffix(got, ":"+tag) {
				t.Fatalf("%s: node %s runs the plugin image %s, want tag %s", what, node, got, tag)
			}
		}
		until(t, "every node's slice ("+what+")", func() bool { return publishedAsWanted(t, c) })
		t.Logf("%s: every node's devices published after %v", what, time.Since(start).Round(time.Millisecond))
	}
	settled("install of "+previousRelease, "prev")

	volta, h100 := c.Nodes[0], c.Nodes[2]
	templateIn(t, c, "default", "rb-gpu", "gpu.gpuiso.io", 1, "")
	templateIn(t, c, "default", "rb-mig", "mig.gpuiso.io", 1, "")
	kept := map[string]*corev1.Pod{}
	devices := map[string]string{}
	// claimPods makes a GPU pod on the V100 node and a MIG pod on the H100
	// node, named after step, and waits until they run.
	claimPods := func(step string) []string {
		t.Helper()
		names := []string{"rb-" + step + "-gpu", "rb-" + step + "-mig"}
		for i, tmpl := range []string{"rb-gpu", "rb-mig"} {
			node := volta.Name
			if tmpl == "rb-mig" {
				node = h100.Name
			}
			createIn(t, c, onNode(in("default", withClaim(probePod(names[i],
				[]string{"do", "env", "NVIDIA_VISIBLE_DEVICES", "--", "cwd", "--", "sleep", "100000"}), tmpl)), node))
		}
		for _, name := range names {
			kept[name] = running(t, c, "default", name)
			devices[name] = parseSeen(podOutput(t, c, name)).env["NVIDIA_VISIBLE_DEVICES"]
			if devices[name] == "" {
				t.Fatalf("pod %s sees no device", name)
			}
		}
		return names
	}
	// keptRunning checks that every pod kept runs in its first container,
	// unrestarted, and still sees its devices.
	keptRunning := func(what string) {
		t.Helper()
		for name, old := range kept {
			p := pod(t, c, name)
			if p.UID != old.UID || p.Status.Phase != corev1.PodRunning || p.Status.ContainerStatuses[0].RestartCount != 0 ||
				p.Status.ContainerStatuses[0].ContainerID != old.Status.ContainerStatuses[0].ContainerID {
				t.Errorf("%s: pod %s is %s, %d restarts, container %s (was %s)", what, name, p.Status.Phase,
					p.Status.ContainerStatuses[0].RestartCount, p.Status.ContainerStatuses[0].ContainerID, old.Status.ContainerStatuses[0].ContainerID)
				continue
			}
			out, err := c.Kubectl(ctx, "exec", name, "--", "/probe", "env", "NVIDIA_VISIBLE_DEVICES")
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			if got := parseSeen(out).env["NVIDIA_VISIBLE_DEVICES"]; got != devices[name] {
				t.Errorf("%s: pod %s sees devices %q, %q before", what, name, got, devices[name])
			}
		}
	}
	// unprepared deletes pods and waits until their nodes' checkpoints are
	// those of the pods kept alone: their claims were unprepared.
	unprepared := func(what string, names ...string) {
		t.Helper()
		for _, name := range names {
			deleteIn(t, c, "default", name)
			delete(kept, name)
		}
		want := map[string]int{}
		for _, p := range kept {
			want[p.Spec.NodeName]++
		}
		until(t, "the claims of "+strings.Join(names, ", ")+" to be unprepared ("+what+")", func() bool {
			for _, n := range c.Nodes {
				entries, _ := os.ReadDir(filepath.Join(n.StateDir, "claims"))
				if len(entries) != want[n.Name] {
					return false
				}
			}
			return true
		})
	}
	upgrade := func(what string) {
		t.Helper()
		start = time.Now()
		if out, err := h.run(ctx, append([]string{"upgrade", release, chartDir, "--namespace", "default", "--wait", "--timeout", "3m"},
			values...)...); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		settled(what, tag)
		keptRunning(what)
	}

	claimPods("prev")
	upgrade("upgrade to this release")
	current := claimPods("current")

	start = time.Now()
	if out, err := h.run(ctx, "rollback", release, "1", "--namespace", "default", "--wait", "--timeout", "3m"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	settled("rollback to "+previousRelease, "prev")
	keptRunning("rollback to " + previousRelease)
	// The previous release unprepares the claims this one prepared, and
	// prepares new ones.
	unprepared("rollback to "+previousRelease, current...)
	claimPods("back")

	upgrade("upgrade again")
	claimPods("again")
	var all []string
	for name := range kept {
		all = append(all, name)
	}
	unprepared("upgrade again", all...)

	uninstalled = true
	testUninstall(t, c, h)
}
