package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/isolator/mps"
	"github.com/gpuiso/gpuiso/kubernetes/internal/cluster"
)

// sharedGPUs are the values that share GPUs 4, 5 and 6 of every node, as
// TestHelmShares installs the chart: each is published as share-<index>
// (never whole), its MPS daemons run outside the plugin's pod.
var sharedGPUs = []string{"--set-string", `sharing.gpus=4\,5\,6`}

// chartTimeSlices is the chart's sharing.timeSlices: the time slices a
// GPU holds at most.
const chartTimeSlices = 4

// The kinds of share a claim template of a load asks for.
const (
	memoryShare = "memory" // a memory share: its own MPS daemon, its memory
	timeSlice   = "time"   // a time slice: the GPU whole, no MPS daemon
	slicePrefix = "slices-"
)

// sliceKind is the kind of a concurrent slice of a GPU split in n.
func sliceKind(n int) string { return slicePrefix + strconv.Itoa(n) }

// shareLoad is a claim template of a load of shares: a share of the GPU
// of index gpu of the pod's node, of kind, asking the scheduler for
// memory. A load keeps what the scheduler may allocate within what the
// GPU holds of the kind: a time slice or a concurrent slice asks for the
// GPU's memory over the time slices or the slice count, so that no more
// of them fit than the allocator holds (it refuses the next at Prepare).
type shareLoad struct {
	template string
	gpu      int
	kind     string
	memory   string
}

// slices is the count a concurrent slice's GPU is split in; 0 for
// another kind.
func (l shareLoad) slices() int {
	s, ok := strings.CutPrefix(l.kind, slicePrefix)
	if !ok {
		return 0
	}
	n, _ := strconv.Atoi(s)
	return n
}

// config is the claim's GPUConfig that asks for the kind.
func (l shareLoad) config() string {
	switch {
	case l.kind == timeSlice:
		return `{"apiVersion":"gpu.gpuiso.io/v1","kind":"GPUConfig","sharing":{"strategy":"TimeSlicing"}}`
	case l.slices() > 0:
		return fmt.Sprintf(`{"apiVersion":"gpu.gpuiso.io/v1","kind":"GPUConfig","sharing":{"strategy":"MPS","mps":{"slices":%d}}}`, l.slices())
	}
	return ""
}

// make makes the claim template (in default), deleted when t ends.
func (l shareLoad) make(t *testing.T, c *cluster.Cluster) {
	t.Helper()
	sharedTemplate(t, c, l.template, l.gpu, l.memory, l.config())
}

// shareLabel is the label of a load's pod that names its share's kind.
const shareLabel = "gpuiso.io/share"

// shareCapacity is the memory, in MiB, of every share device published,
// by node and GPU UUID.
func shareCapacity(t *testing.T, c *cluster.Cluster) map[string]map[string]int64 {
	t.Helper()
	l, err := c.Client.ResourceV1().ResourceSlices().List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]int64{}
	for _, s := range l.Items {
		if s.Spec.Driver != driver || s.Spec.NodeName == nil {
			continue
		}
		for _, d := range s.Spec.Devices {
			uuid := d.Attributes["uuid"].StringValue
			capa, ok := d.Capacity[resourceapi.QualifiedName("memory")]
			if typ := d.Attributes["type"].StringValue; typ == nil || *typ != "share" || uuid == nil || !ok {
				continue
			}
			if out[*s.Spec.NodeName] == nil {
				out[*s.Spec.NodeName] = map[string]int64{}
			}
			out[*s.Spec.NodeName][*uuid] = capa.Value.Value() >> 20
		}
	}
	return out
}

// mpsLimitMiB reads CUDA_MPS_PINNED_DEVICE_MEM_LIMIT ("0=<MiB>M") as a
// pod's environment holds it; 0 when it holds none.
func mpsLimitMiB(env string) int64 {
	_, v, _ := strings.Cut(env, "=")
	n, _ := strconv.ParseInt(strings.TrimSuffix(v, "M"), 10, 64)
	return n
}

// keptDaemon is an MPS daemon a running share holds, with the limit it
// gives as its control client reads it (from its own namespace and from
// the node's), to be found the same later.
type keptDaemon struct {
	d                mps.Daemon
	limit, nodeLimit string
}

// keepDaemon reads owner's daemon on n; it must run.
func keepDaemon(t *testing.T, n *cluster.Node, owner string) keptDaemon {
	t.Helper()
	d, ok := daemonsOn(t, n)[owner]
	if !ok || !d.Alive || d.Pid == 0 {
		t.Fatalf("node %s: the MPS daemon of %s: %+v (%v)", n.Name, owner, d, ok)
	}
	return keptDaemon{d: d, limit: daemonLimit(t, d.Pid), nodeLimit: nodeLimit(t, n, owner)}
}

// same reports (t.Errorf) a kept daemon that is no longer the same
// process or no longer gives the same limit.
func (k keptDaemon) same(t *testing.T, n *cluster.Node, when string) {
	t.Helper()
	now, ok := daemonsOn(t, n)[k.d.Owner]
	if !ok || !now.Alive || now.Pid != k.d.Pid || now.Start != k.d.Start {
		t.Errorf("%s: the MPS daemon of %s is %+v (%v), was pid %d started at %d", when, k.d.Owner, now, ok, k.d.Pid, k.d.Start)
		return
	}
	if l := daemonLimit(t, now.Pid); l != k.limit {
		t.Errorf("%s: the MPS daemon of %s holds %q, held %q", when, k.d.Owner, l, k.limit)
	}
	if l := nodeLimit(t, n, k.d.Owner); l != k.nodeLimit {
		t.Errorf("%s: the MPS daemon of %s holds %q asked from the node, held %q", when, k.d.Owner, l, k.nodeLimit)
	}
}

// daemonsOn lists the MPS daemons recorded on n, by owner.
func daemonsOn(t *testing.T, n *cluster.Node) map[string]mps.Daemon {
	t.Helper()
	ds, err := mps.Daemons(context.Background(), filepath.Join(n.StateDir, "mps"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]mps.Daemon{}
	for _, d := range ds {
		out[d.Owner] = d
	}
	return out
}

// mpsLeftovers lists what shares left on n once none is held: MPS
// processes in the node's cgroup (a daemon's or a server's), entries of
// the MPS manager's directory beside its lock, the daemons' cgroups, and
// mounts of a daemon's directories in the node's mount namespace.
func mpsLeftovers(n *cluster.Node) []string {
	var out []string
	for _, pid := range procsOf("nvidia-cuda-mps") {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		if err == nil && bytes.Contains(b, []byte("/"+n.CgroupName()+"/")) {
			out = append(out, fmt.Sprintf("%s: MPS process %d", n.Name, pid))
		}
	}
	dir := filepath.Join(n.StateDir, "mps")
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if e.Name() != ".lock" {
			out = append(out, filepath.Join(dir, e.Name()))
		}
	}
	hs, _ := linux.CgroupHierarchies("/sys/fs/cgroup")
	for _, h := range hs {
		cgs, _ := os.ReadDir(filepath.Join(h.Dir, n.CgroupName(), mps.CgroupDir))
		for _, e := range cgs {
			if e.IsDir() {
				out = append(out, filepath.Join(h.Dir, n.CgroupName(), mps.CgroupDir, e.Name()))
			}
		}
	}
	for _, pid := range procsOf("containerd", n.ContainerdAddress()) {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, "/gpuiso-kubelet-plugin/mps/") {
				out = append(out, fmt.Sprintf("%s: mount %s", n.Name, l))
			}
		}
	}
	return out
}
