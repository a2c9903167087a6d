package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

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

// sharedTemplate makes a claim template of one share of the shared GPU
// of index gpu (a CEL selector), asking for memory, with config, when
// set, as the claim's GPUConfig parameters.
func sharedTemplate(t *testing.T, c *cluster.Cluster, name string, gpu int, memory, config string) {
	t.Helper()
	req := &resourceapi.ExactDeviceRequest{DeviceClassName: shareClass, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
		Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: fmt.Sprintf(`device.attributes["gpu.gpuiso.io"].index == %d`, gpu)}}},
		Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse(memory)}}}
	tmpl := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}}
	tmpl.Spec.Spec.Devices.Requests = []resourceapi.DeviceRequest{{Name: "gpus", Exactly: req}}
	if config != "" {
		tmpl.Spec.Spec.Devices.Config = []resourceapi.DeviceClaimConfiguration{{Requests: []string{"gpus"},
			DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
				Driver: "gpu.gpuiso.io", Parameters: runtime.RawExtension{Raw: []byte(config)}}}}}
	}
	if _, err := c.Client.ResourceV1().ResourceClaimTemplates("default").Create(t.Context(), tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Client.ResourceV1().ResourceClaimTemplates("default").Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

// TestHelmShares installs the chart with GPUs 4, 5 and 6 of the simulated
// DGX-1 shared (sharing.gpus=4,5,6), the real MPS control daemon run from
// the node's driver root. Six pods with claims of memory shares of 2 GiB
// of GPU 4 each get a daemon of their own, placed in a cgroup outside the
// plugin's pod; from inside each pod sees only its GPU, its own daemon's
// pipe directory and a /dev/shm bounded at the chart's 64 MiB (a write
// past it is ENOSPC), and each daemon holds 2 GiB. Four pods with claims
// of concurrent slices of GPU 5 (mps.slices 4) share the GPU's one daemon,
// which holds 4 GiB (a quarter) by default: each sees GPU 5 and that
// daemon's directories. Two pods with claims of time slices of GPU 6
// (TimeSlicing) see GPU 6 and no MPS daemon, and none is started for
// them. Then `helm upgrade` rolls the DaemonSet and every node's plugin
// process gets SIGKILL: the twelve pods run on with no restart,
// the daemons are the same processes, holding the same limits. After the
// pods and the uninstall no daemon, cgroup or mount is left.
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
	values := append(installValues(t, c, freeMetricsPort(t, c)), "--set-string", `sharing.gpus=4\,5\,6`)
	if _, err := h.run(ctx, append([]string{"install", release, chartDir, "--namespace", "default", "--wait", "--timeout", "3m"}, values...)...); err != nil {
		t.Fatalf("%v\n%s", err, c.Logs(2000))
	}
	uninstalled := false
	h.uninstallAtEnd(t, c, &uninstalled)
	until(t, "the DaemonSet on every node", func() bool { return daemonSetRolled(t, c) })
	volta := c.Nodes[0]
	var share, sliced, timed nodeDevice
	until(t, "the shares of GPUs 4, 5 and 6 in the DGX-1's slice", func() bool {
		for _, d := range slicesByNode(t, c)[volta.Name] {
			switch d.name {
			case "share-4":
				share = d
			case "share-5":
				sliced = d
			case "share-6":
				timed = d
			}
		}
		return share.name != "" && sliced.name != "" && timed.name != ""
	})
	major, all := nodeMajor(t, volta), append(minorsOn(t, c, volta.Name), share.minor, sliced.minor, timed.minor)
	if share.uuid == "" || sliced.uuid == "" || timed.uuid == "" {
		t.Fatalf("a share device has no uuid: %+v, %+v, %+v", share, sliced, timed)
	}
	sharedTemplate(t, c, "hshare-2g", 4, "2Gi", "")
	sharedTemplate(t, c, "hshare-slice", 5, "4Gi", `{"apiVersion":"gpu.gpuiso.io/v1","kind":"GPUConfig","sharing":{"strategy":"MPS","mps":{"slices":4}}}`)
	sharedTemplate(t, c, "hshare-time", 6, "1Gi", `{"apiVersion":"gpu.gpuiso.io/v1","kind":"GPUConfig","sharing":{"strategy":"TimeSlicing"}}`)
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
	names := []string{"hshare-m0", "hshare-m1", "hshare-m2", "hshare-m3", "hshare-m4", "hshare-m5"}
	sliceNames := []string{"hshare-s0", "hshare-s1", "hshare-s2", "hshare-s3"}
	timeNames := []string{"hshare-t0", "hshare-t1"}
	for _, name := range timeNames {
		args := isolationArgs(major, all, true, "env", "CUDA_MPS_PIPE_DIRECTORY", "--", "ls", "/tmp/nvidia-mps")
		createPod(t, c, onNode(withClaim(probePod(name, args), "hshare-time"), volta.Name))
	}
	for _, name := range sliceNames {
		createPod(t, c, onNode(withClaim(probePod(name, shareArgs(major, all, name)), "hshare-slice"), volta.Name))
	}
	for _, name := range names {
		args := isolationArgs(major, all, true,
			"write", "/tmp/nvidia-mps/seen-by-"+name, "/dev/shm/seen-by-"+name, "--",
			"ls", "/tmp/nvidia-mps", "--",
			"env", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "--",
			"fill", "/dev/shm/small", strconv.Itoa(1<<20), "--",
			"fill", "/dev/shm/big", strconv.Itoa(shmBytes+1<<20))
		createPod(t, c, onNode(withClaim(probePod(name, args), "hshare-2g"), volta.Name))
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
		if !ok || !d.Alive || d.Limits.MemoryBytes != 2<<30 {
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
		if limits[name] != "2G" && limits[name] != "2048M" {
			t.Errorf("pod %s: its daemon holds %q, want 2G", name, limits[name])
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
	pids := map[int]string{}
	for name, d := range byPod {
		if other, ok := pids[d.Pid]; ok {
			t.Fatalf("the shares of %s and %s have one daemon: %+v", name, other, d)
		}
		pids[d.Pid] = name
	}

	// The concurrent slices of GPU 5: one daemon, a quarter of the GPU
	// by default, whose directories every slice's pod has.
	sliceOwner := mps.SliceOwner(sliced.uuid)
	for _, name := range sliceNames {
		out := podOutput(t, c, name)
		parseSeen(out).check(t, all, []int{sliced.minor}, []string{sliced.uuid})
		for _, want := range []string{"/tmp/nvidia-mps/seen-by-" + name + " ok", "/dev/shm/seen-by-" + name + " ok", "control\n"} {
			if !strings.Contains(out, want) {
				t.Errorf("pod %s: no %q in what it saw:\n%s", name, strings.TrimSpace(want), out)
			}
		}
		kept[name] = running(t, c, "default", name)
	}
	// The time slices of GPU 6: the GPU, no daemon.
	for _, name := range timeNames {
		out := podOutput(t, c, name)
		parseSeen(out).check(t, all, []int{timed.minor}, []string{timed.uuid})
		if strings.Contains(out, "CUDA_MPS_PIPE_DIRECTORY=") || strings.Contains(out, "control\n") {
			t.Errorf("pod %s of a time slice has an MPS daemon:\n%s", name, out)
		}
		kept[name] = running(t, c, "default", name)
	}
	slicer, ok := daemons()[sliceOwner]
	if !ok || !slicer.Alive || slicer.Slices != 4 || slicer.GPU != sliced.uuid {
		t.Fatalf("the daemon of GPU 5's slices: %+v (%v), daemons %v", slicer, ok, daemons())
	}
	if _, ok := pids[slicer.Pid]; ok {
		t.Fatalf("the slices' daemon is a memory share's: %+v", slicer)
	}
	if len(daemons()) != len(names)+1 {
		t.Errorf("daemons %v, want one per memory share and one for the slices (none for the time slices)", daemons())
	}
	byPod["slices"] = slicer
	limits["slices"] = daemonLimit(t, slicer.Pid)
	if limits["slices"] != "4G" && limits["slices"] != "4096M" {
		t.Errorf("the slices' daemon holds %q, want 4G", limits["slices"])
	}
	for _, name := range sliceNames {
		root := fmt.Sprintf("/proc/%d/root", slicer.Pid)
		for _, f := range []string{root + "/tmp/nvidia-mps/seen-by-" + name, root + "/dev/shm/seen-by-" + name} {
			if _, err := os.Stat(f); err != nil {
				t.Errorf("%s's mark in the slices' daemon: %v", name, err)
			}
		}
	}
	same := func(when string) {
		t.Helper()
		now := daemons()
		for _, name := range append(slices.Clone(names), "slices") {
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
		}
		for _, name := range append(slices.Concat(names, sliceNames), timeNames...) {
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
	t.Logf("daemons kept through the upgrade and the kill: %d memory shares' (%s each), pids %v; the %d slices' of GPU 5, pid %d (%s); %d time slices of GPU 6, no daemon",
		len(names), limits[names[0]], pids, len(sliceNames), slicer.Pid, limits["slices"], len(timeNames))

	for _, name := range append(slices.Concat(names, sliceNames), timeNames...) {
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
