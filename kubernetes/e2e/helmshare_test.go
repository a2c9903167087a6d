package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/isolator/mps"
	"github.com/gpuiso/gpuiso/kubernetes/internal/cluster"
)

// procsOf lists the host's processes whose command (comm) starts with
// comm and whose command line holds every one of args.
func procsOf(comm string, args ...string) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		c, err := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
		if err != nil || !strings.HasPrefix(strings.TrimSpace(string(c)), comm) {
			continue
		}
		cl, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		all := true
		for _, a := range args {
			all = all && bytes.Contains(cl, []byte(a))
		}
		if all {
			out = append(out, pid)
		}
	}
	return out
}

// daemonLimit asks the MPS daemon pid for its default pinned memory
// limit of device 0, from the daemon's own mount namespace (made from the
// node's: the node's client binary), through the pipe directory as the
// daemon and the servers it starts see it.
func daemonLimit(t *testing.T, pid int) string {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), "nsenter", "--target", strconv.Itoa(pid), "--mount", "--",
		"/usr/bin/nvidia-cuda-mps-control")
	cmd.Env = []string{"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"}
	cmd.Stdin = strings.NewReader("get_default_device_pinned_mem_limit 0\n")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Errorf("daemon %d: control client: %v: %s", pid, err, out)
	}
	return strings.TrimSpace(string(out))
}

// nodeLimit asks owner's MPS daemon for its default pinned memory limit
// of device 0 as the plugin does, from the node's mount namespace (that
// of the node's containerd), through the pipe directory the node has
// mounted under the chart's state directory, with the host's client.
func nodeLimit(t *testing.T, n *cluster.Node, owner string) string {
	t.Helper()
	ctrd := procsOf("containerd", n.ContainerdAddress())
	if len(ctrd) == 0 {
		t.Fatalf("no containerd of node %s", n.Name)
	}
	cmd := exec.CommandContext(t.Context(), "nsenter", "--target", strconv.Itoa(ctrd[0]), "--mount", "--", "/usr/bin/nvidia-cuda-mps-control")
	cmd.Env = []string{"CUDA_MPS_PIPE_DIRECTORY=/var/lib/gpuiso-kubelet-plugin/mps/" + owner + "/pipe"}
	cmd.Stdin = strings.NewReader("get_default_device_pinned_mem_limit 0\n")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Errorf("node %s, daemon of %s: control client: %v: %s", n.Name, owner, err, out)
	}
	return strings.TrimSpace(string(out))
}

// TestHelmShares installs the chart with memory shares of GPU 4 of the
// simulated DGX-1 (sharing.gpus=4), the real MPS control daemon run from
// the node's driver root: two pods with claims of 8 GiB each get a daemon
// of their own, placed in a cgroup outside the plugin's pod; from inside
// each pod sees only its GPU, its own daemon's pipe directory and a
// /dev/shm bounded at the chart's 64 MiB (a write past it is ENOSPC), and
// each daemon holds 8 GiB. Then `helm upgrade` rolls the DaemonSet and
// every node's plugin process gets SIGKILL: the pods run on with no
// restart, the daemons are the same processes, holding the same limits.
// After the pods and the uninstall no daemon, cgroup or mount is left.
func TestHelmShares(t *testing.T) {
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
	// GPU 4: whole on every node's kind (hgx-h100-mig splits 0-3).
	values := append(installValues(t, c, freeMetricsPort(t, c)), "--set-string", "sharing.gpus=4")
	if _, err := h.run(ctx, append([]string{"install", release, chartDir, "--namespace", "default", "--wait", "--timeout", "3m"}, values...)...); err != nil {
		t.Fatalf("%v\n%s", err, c.Logs(2000))
	}
	uninstalled := false
	h.uninstallAtEnd(t, c, &uninstalled)
	until(t, "the DaemonSet on every node", func() bool { return daemonSetRolled(t, c) })
	volta := c.Nodes[0]
	var share nodeDevice
	until(t, "the share of GPU 4 in the DGX-1's slice", func() bool {
		for _, d := range slicesByNode(t, c)[volta.Name] {
			if d.name == "share-4" {
				share = d
				return true
			}
		}
		return false
	})
	major, all := nodeMajor(t, volta), append(minorsOn(t, c, volta.Name), share.minor)
	if share.uuid == "" {
		t.Fatalf("the share device has no uuid: %+v", share)
	}
	shareTemplate(t, c, "hshare-8g", "8Gi")
	mpsDir := filepath.Join(volta.StateDir, "mps")
	daemons := func() map[string]mps.Daemon {
		ds, err := mps.Daemons(context.Background(), mpsDir)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]mps.Daemon{}
		for _, d := range ds {
			out[d.Owner] = d
		}
		return out
	}
	const shmBytes = 64 << 20
	names := []string{"hshare-a", "hshare-b"}
	for _, name := range names {
		args := isolationArgs(major, all, true,
			"write", "/tmp/nvidia-mps/seen-by-"+name, "/dev/shm/seen-by-"+name, "--",
			"ls", "/tmp/nvidia-mps", "--",
			"env", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "--",
			"fill", "/dev/shm/small", strconv.Itoa(1<<20), "--",
			"fill", "/dev/shm/big", strconv.Itoa(shmBytes+1<<20))
		createPod(t, c, onNode(withClaim(probePod(name, args), "hshare-8g"), volta.Name))
	}
	kept := map[string]*corev1.Pod{}
	byPod := map[string]mps.Daemon{}
	limits := map[string]string{}
	for _, name := range names {
		out := podOutput(t, c, name)
		parseSeen(out).check(t, all, []int{share.minor}, []string{share.uuid})
		for _, want := range []string{"/tmp/nvidia-mps/seen-by-" + name + " ok", "/dev/shm/seen-by-" + name + " ok", "control\n",
			fmt.Sprintf("fill /dev/shm/small %d ok", 1<<20), fmt.Sprintf("fill /dev/shm/big %d ENOSPC", shmBytes+1<<20)} {
			if !strings.Contains(out, want) {
				t.Errorf("pod %s: no %q in what it saw:\n%s", name, strings.TrimSpace(want), out)
			}
		}
		kept[name] = running(t, c, "default", name)
		owner := "claim-" + string(claimOf(t, c, name).UID)
		d, ok := daemons()[owner]
		if !ok || !d.Alive || d.Limits.MemoryBytes != 8<<30 {
			t.Fatalf("pod %s: daemon %+v (%v)", name, d, ok)
		}
		byPod[name] = d
		if d.Cgroup != "/"+volta.CgroupName()+"/"+mps.CgroupDir+"/"+owner {
			t.Errorf("pod %s: daemon's cgroup %q, want <node's cgroup>/gpuiso-mps/%s", name, d.Cgroup, owner)
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", d.Pid))
		if err != nil {
			t.Fatal(err)
		}
		cgs, err := linux.ProcCgroups(b)
		if err != nil {
			t.Fatal(err)
		}
		for ctrl, p := range cgs {
			if p != d.Cgroup && ctrl != "" {
				t.Errorf("pod %s: daemon %d is in %s cgroup %s, want %s", name, d.Pid, ctrl, p, d.Cgroup)
			}
		}
		limits[name] = daemonLimit(t, d.Pid)
		if limits[name] != "8G" && limits[name] != "8192M" {
			t.Errorf("pod %s: its daemon holds %q, want 8G", name, limits[name])
		}
		if l := nodeLimit(t, volta, owner); l != limits[name] {
			t.Errorf("pod %s: its daemon holds %q asked from the node, %q from its own namespace", name, l, limits[name])
		}
	}
	// Each pod's marks are in its own daemon's directories alone.
	for _, name := range names {
		for _, other := range names {
			root := fmt.Sprintf("/proc/%d/root", byPod[other].Pid)
			for _, f := range []string{root + "/tmp/nvidia-mps/seen-by-" + name, root + "/dev/shm/seen-by-" + name} {
				if _, err := os.Stat(f); (err == nil) != (name == other) {
					t.Errorf("%s's mark in %s's daemon: %s: %v", name, other, f, err)
				}
			}
		}
	}
	if byPod[names[0]].Pid == byPod[names[1]].Pid {
		t.Fatalf("the two shares have one daemon: %+v", byPod)
	}
	same := func(when string) {
		t.Helper()
		now := daemons()
		for _, name := range names {
			d := byPod[name]
			if n := now[d.Owner]; !n.Alive || n.Pid != d.Pid || n.Start != d.Start {
				t.Errorf("%s: the daemon of %s is %+v, was pid %d", when, name, n, d.Pid)
			}
			if l := nodeLimit(t, volta, d.Owner); l != limits[name] {
				t.Errorf("%s: the daemon of %s holds %q asked from the node, held %q", when, name, l, limits[name])
			}
			if l := daemonLimit(t, d.Pid); l != limits[name] {
				root := fmt.Sprintf("/proc/%d/root", d.Pid)
				ls, _ := exec.Command("ls", "-la", root+"/tmp/nvidia-mps", root+"/tmp").CombinedOutput()
				logb, _ := os.ReadFile(root + "/tmp/nvidia-mps-log/control.log")
				t.Errorf("%s: the daemon of %s holds %q, held %q; its pipe directory:\n%s\nits log:\n%s", when, name, l, limits[name], ls, logb)
			}
			p := pod(t, c, name)
			if p.UID != kept[name].UID || p.Status.Phase != corev1.PodRunning || p.Status.ContainerStatuses[0].RestartCount != 0 ||
				p.Status.ContainerStatuses[0].ContainerID != kept[name].Status.ContainerStatuses[0].ContainerID {
				t.Errorf("%s: pod %s is %s, %d restarts", when, name, p.Status.Phase, p.Status.ContainerStatuses[0].RestartCount)
			}
		}
	}

	// An upgrade that rolls the DaemonSet.
	before := pluginPods(t, c)
	if _, err := h.run(ctx, "upgrade", release, chartDir, "--namespace", "default", "--wait", "--timeout", "3m",
		"--reuse-values", "--set", "healthRefresh=3s"); err != nil {
		t.Fatal(err)
	}
	until(t, "the DaemonSet to roll", func() bool { return daemonSetRolled(t, c) })
	for node, p := range pluginPods(t, c) {
		if before[node].UID == p.UID {
			t.Errorf("node %s: the plugin pod %s was not replaced", node, p.Name)
		}
	}
	same("after the upgrade")

	// SIGKILL of every node's plugin process.
	plugins := procsOf("gpuiso-kubelet-", "--daemonset="+pluginNS+"/"+daemonSet)
	if len(plugins) != len(c.Nodes) {
		t.Fatalf("plugin processes %v, want one per node", plugins)
	}
	restarts := map[string]int32{}
	for node, p := range pluginPods(t, c) {
		restarts[node] = p.Status.ContainerStatuses[0].RestartCount
	}
	for _, pid := range plugins {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	until(t, "every node's plugin to restart", func() bool {
		pods := pluginPods(t, c)
		for node, n := range restarts {
			p := pods[node]
			if len(p.Status.ContainerStatuses) == 0 || p.Status.ContainerStatuses[0].RestartCount <= n || !p.Status.ContainerStatuses[0].Ready {
				return false
			}
		}
		return true
	})
	same("after SIGKILL of the plugins")
	t.Logf("daemons kept through the upgrade and the kill: %s pid %d, %s pid %d (%s each)", names[0], byPod[names[0]].Pid,
		names[1], byPod[names[1]].Pid, limits[names[0]])

	for _, name := range names {
		deletePod(t, c, name)
	}
	until(t, "every daemon to go", func() bool { return len(daemons()) == 0 })
	uninstalled = true
	if _, err := h.run(ctx, "uninstall", release, "--namespace", "default", "--wait", "--timeout", "2m"); err != nil {
		t.Fatal(err)
	}
	until(t, "the nodes' slices to go", func() bool { return len(slicesByNode(t, c)) == 0 })
	for _, d := range byPod {
		st, err := linux.ReadProcStat("/proc", d.Pid)
		if s := mps.Strays("/proc", d.Mark); len(s) > 0 || err == nil && st.Start == d.Start && !st.Exited() {
			t.Errorf("MPS processes of %s left: %v", d.Owner, s)
		}
		hs, err := linux.CgroupHierarchies("/sys/fs/cgroup")
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range hs {
			for _, p := range []string{d.Cgroup, filepath.Dir(d.Cgroup)} {
				if _, err := os.Stat(filepath.Join(h.Dir, p)); !os.IsNotExist(err) {
					t.Errorf("cgroup %s left in %s: %v", p, h.Dir, err)
				}
			}
		}
	}
	for _, n := range c.Nodes {
		if _, err := os.Stat(filepath.Join(n.StateDir, "mps")); !os.IsNotExist(err) {
			t.Errorf("the MPS daemons' directory is left on %s: %v", n.Name, err)
		}
		for _, f := range nodeFiles(n) {
			entries, _ := os.ReadDir(f)
			var names []string
			for _, e := range entries {
				names = append(names, e.Name())
			}
			t.Logf("left on %s after the uninstall: %s %v", n.Name, f, names)
		}
	}
	for _, pid := range procsOf("containerd", volta.ContainerdAddress()) {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
		if bytes.Contains(b, []byte("/gpuiso-kubelet-plugin/mps")) {
			t.Errorf("mounts of the shares left in %s's namespace:\n%s", volta.Name, b)
		}
	}
}
