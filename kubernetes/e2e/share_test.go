package e2e

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/isolator/mps"
	"github.com/gpuiso/gpuiso/kubernetes/internal/cluster"
)

// shareClass is the chart's DeviceClass of shares of a GPU.
const shareClass = "share.gpuiso.io"

// ensureShareClass makes the share class as the chart does; it is removed
// when t ends (an installation of the chart owns a class of that name).
func ensureShareClass(t *testing.T, c *cluster.Cluster) {
	t.Helper()
	dc := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: shareClass}, Spec: resourceapi.DeviceClassSpec{
		Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: `device.driver == "gpu.gpuiso.io" && device.attributes["gpu.gpuiso.io"].type == "share"`,
		}}},
	}}
	if _, err := c.Client.ResourceV1().DeviceClasses().Create(t.Context(), dc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Client.ResourceV1().DeviceClasses().Delete(context.Background(), shareClass, metav1.DeleteOptions{})
	})
}

// shareTemplate makes a ResourceClaimTemplate of one request for a share
// of memory of a GPU; it is removed when t ends.
func shareTemplate(t *testing.T, c *cluster.Cluster, name, memory string) {
	t.Helper()
	req := &resourceapi.ExactDeviceRequest{DeviceClassName: shareClass, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
		Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse(memory)}}}
	tmpl := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}}
	tmpl.Spec.Spec.Devices.Requests = []resourceapi.DeviceRequest{{Name: "gpus", Exactly: req}}
	if _, err := c.Client.ResourceV1().ResourceClaimTemplates("default").Create(t.Context(), tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Client.ResourceV1().ResourceClaimTemplates("default").Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

// shareArgs make the probe report what isolationArgs does, then leave a
// mark named after the pod in its MPS pipe directory and its /dev/shm and
// report the MPS environment; the pod then keeps running.
func shareArgs(major uint32, minors []int, name string) []string {
	return isolationArgs(major, minors, true,
		"write", "/tmp/nvidia-mps/seen-by-"+name, "/dev/shm/seen-by-"+name, "--",
		"ls", "/tmp/nvidia-mps", "--",
		"env", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")
}

// TestDRAShares runs the seed's scenario through the DRA driver on a
// simulated DGX-1 (Volta) whose GPU 0 (16 GiB) is shared
// (--shared-gpus 0): two pods with claims of 8 GiB share it, a third stays
// pending (unschedulable: the GPU's memory is taken) until one of them
// ends, and each pod sees from inside only its GPU, its limit (the MPS
// environment) and its own MPS daemon's pipe directory and /dev/shm (a
// mark it leaves there is in its daemon's directories on the host and in
// no other's), while each daemon holds its 8 GiB. The plugin is killed
// (SIGKILL) and started again meanwhile: the daemons run on, kept. After
// the pods end no daemon, share, CDI spec or checkpoint is left.
func TestDRAShares(t *testing.T) {
	c := requireCluster(t)
	testenv.RequireSimulatedMPS(t)
	ensureClasses(t, c)
	ensureShareClass(t, c)
	// The plugin runs on the host, whose mounts do not reach the node's
	// mount namespace: plain directories (TestHelmShares has the bounded
	// ones, from a pod).
	p := startPlugin(t, c, "dgx1-volta", "--device-plugin=false", "--shared-gpus", "0", "--mps-plain-dirs")
	mpsDir := filepath.Join(p.stateDir, "mps")
	t.Cleanup(func() {
		// After the pods, before the plugin stops: a daemon left here is
		// a failure, and stopped.
		if ds, _ := mps.Daemons(context.Background(), mpsDir); len(ds) > 0 {
			t.Errorf("MPS daemons left after the pods ended: %+v", ds)
			if m, err := mps.New(mpsDir); err == nil {
				m.Sweep(context.Background(), nil)
				m.Close()
			}
		}
	})
	inv := p.inventory()
	byUUID, all := minorsOf(inv)
	major := p.major()
	gpu := inv.Devices[0]
	if gpu.MemoryBytes != 16<<30 {
		t.Fatalf("the shared GPU has %d bytes, want 16 GiB", gpu.MemoryBytes)
	}
	until(t, "the slice's share of GPU 0 and 7 whole GPUs", func() bool {
		d := sliceDevices(t, c)
		return len(d) == 8 && slices.Contains(d, "share-0") && !slices.Contains(d, "gpu-0")
	})
	shareTemplate(t, c, "share-8g", "8Gi")

	daemons := func() map[string]mps.Daemon {
		ds, err := mps.Daemons(t.Context(), mpsDir)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]mps.Daemon{}
		for _, d := range ds {
			out[d.Owner] = d
		}
		return out
	}
	m, err := mps.New(mpsDir)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	// check checks pod name from inside and its daemon from the host.
	check := func(name string) mps.Daemon {
		t.Helper()
		out := podOutput(t, c, name)
		s := parseSeen(out)
		s.check(t, all, []int{byUUID[gpu.UUID]}, []string{gpu.UUID})
		if s.env["CUDA_MPS_PIPE_DIRECTORY"] != "/tmp/nvidia-mps" || s.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] != "0=8192M" {
			t.Errorf("pod %s: MPS environment %v, want the pipe directory and 0=8192M", name, s.env)
		}
		for _, want := range []string{"/tmp/nvidia-mps/seen-by-" + name + " ok", "/dev/shm/seen-by-" + name + " ok", "control\n", "control_privileged\n"} {
			if !strings.Contains(out, want) {
				t.Errorf("pod %s: no %q in what it saw:\n%s", name, strings.TrimSpace(want), out)
			}
		}
		claim := claimOf(t, c, name)
		r := claim.Status.Allocation.Devices.Results
		var consumed int64
		if len(r) == 1 {
			q := r[0].ConsumedCapacity["memory"]
			consumed = q.Value()
		}
		if len(r) != 1 || r[0].Device != "share-0" || r[0].ShareID == nil || consumed != 8<<30 {
			t.Errorf("pod %s: allocated %+v", name, r)
		}
		owner := "claim-" + string(claim.UID)
		d, ok := daemons()[owner]
		if !ok || !d.Alive || d.GPU != gpu.UUID || d.Limits.MemoryBytes != 8<<30 {
			t.Fatalf("pod %s: daemon %+v (%v)", name, d, ok)
		}
		held, err := m.Held(t.Context(), owner)
		if err != nil || !held.MemorySet || held.MemoryMinMiB > 8192 || held.MemoryMaxMiB < 8192 {
			t.Errorf("pod %s: its daemon holds %+v (%v), want 8192 MiB", name, held, err)
		}
		// The pod's marks are in its daemon's directories, and in no
		// other daemon's.
		for _, other := range daemons() {
			for _, f := range []string{filepath.Join(other.PipeDir, "seen-by-"+name), filepath.Join(other.ShmDir, "seen-by-"+name)} {
				_, err := os.Stat(f)
				if mine := other.Owner == owner; mine != (err == nil) {
					t.Errorf("pod %s: %s exists: %v, want %v", name, f, err == nil, mine)
				}
			}
		}
		return d
	}

	createPod(t, c, withClaim(probePod("share-a", shareArgs(major, all, "share-a")), "share-8g"))
	createPod(t, c, withClaim(probePod("share-b", shareArgs(major, all, "share-b")), "share-8g"))
	da, db := check("share-a"), check("share-b")
	if da.Owner == db.Owner || da.PipeDir == db.PipeDir {
		t.Fatalf("the two shares have one daemon: %+v, %+v", da, db)
	}

	createPod(t, c, withClaim(probePod("share-c", shareArgs(major, all, "share-c")), "share-8g"))
	until(t, "share-c to be unschedulable", func() bool { return unschedulable(pod(t, c, "share-c")) })
	if ph := pod(t, c, "share-c").Status.Phase; ph != corev1.PodPending {
		t.Fatalf("share-c is %s while the GPU's 16 GiB are taken", ph)
	}
	if n := len(daemons()); n != 2 {
		t.Errorf("%d daemons while two shares are prepared", n)
	}

	// The plugin killed and started again: the daemons run on.
	p.cmd.Process.Kill()
	<-p.done
	p.start()
	until(t, "the restarted plugin to find the prepared claims", func() bool { return strings.Contains(p.log.String(), "prepared claims kept") })
	for _, before := range []mps.Daemon{da, db} {
		if now := daemons()[before.Owner]; !now.Alive || now.Pid != before.Pid {
			t.Errorf("after the plugin's restart the daemon of %s is %+v, was pid %d", before.Owner, now, before.Pid)
		}
	}
	for _, name := range []string{"share-a", "share-b"} {
		if ph := pod(t, c, name).Status.Phase; ph != corev1.PodRunning {
			t.Errorf("after the plugin's restart %s is %s", name, ph)
		}
	}

	// One share ends: its daemon goes, and the third pod gets its place.
	start := time.Now()
	deletePod(t, c, "share-a")
	until(t, "share-a's daemon to go", func() bool { _, ok := daemons()[da.Owner]; return !ok })
	if _, err := os.Stat(da.Dir); !os.IsNotExist(err) {
		t.Errorf("share-a's daemon directory is left: %v", err)
	}
	dc := check("share-c")
	t.Logf("share-c ran %v after share-a was deleted", time.Since(start).Round(time.Millisecond))
	if dc.Owner == db.Owner {
		t.Errorf("share-c has share-b's daemon")
	}

	uids := []string{strings.TrimPrefix(db.Owner, "claim-"), strings.TrimPrefix(dc.Owner, "claim-")}
	deletePod(t, c, "share-b")
	deletePod(t, c, "share-c")
	until(t, "every daemon to go", func() bool { return len(daemons()) == 0 })
	for _, d := range []mps.Daemon{da, db, dc} {
		if s := mps.Strays("/proc", d.Mark); len(s) > 0 {
			t.Errorf("MPS processes of %s left: %v", d.Owner, s)
		}
	}
	for _, uid := range uids {
		for _, f := range []string{filepath.Join(c.CDIDir, driver+"-claim_alloc-claim-"+uid+".json"), filepath.Join(p.stateDir, "claims", uid+".json")} {
			until(t, f+" to go", func() bool { _, err := os.Stat(f); return os.IsNotExist(err) })
		}
	}
	a, err := allocator.New(inv, allocator.WithStateDir(filepath.Join(p.stateDir, "allocator")), allocator.WithShared(gpu.UUID))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if shares, err := a.Shares(gpu.UUID); err != nil || len(shares) > 0 {
		t.Errorf("shares left on the GPU: %+v, %v", shares, err)
	}
}

// TestDevicePluginTimeSlices serves a simulated DGX-1 (Volta) through the
// device plugin alone, its GPU 0 as two time slices (--shared-gpus 0
// --time-slices 2): two pods asking for nvidia.com/gpu.shared: 1 run on
// GPU 0 together, each seeing from inside that GPU alone, while the
// allocator holds two time slices of it; a third stays pending until one
// ends; once the pods end, the plugin gives the time slices back (the
// kubelet's pod-resources service no longer lists them).
func TestDevicePluginTimeSlices(t *testing.T) {
	c := requireCluster(t)
	const shared = "nvidia.com/gpu.shared"
	p := startPlugin(t, c, "dgx1-volta", "--dra=false", "--shared-gpus", "0", "--time-slices", "2",
		"--pod-resources-socket", filepath.Join(c.KubeletRoot, "pod-resources", "kubelet.sock"))
	inv := p.inventory()
	byUUID, all := minorsOf(inv)
	major := p.major()
	gpu := inv.Devices[0]
	until(t, "7 whole GPUs and 2 time slices", func() bool {
		return allocatable(t, c, gpuResource) == 7 && allocatable(t, c, shared) == 2
	})
	timeSlices := func() []string {
		a, err := allocator.New(inv, allocator.WithStateDir(filepath.Join(p.stateDir, "allocator")), allocator.WithShared(gpu.UUID), allocator.WithTimeSlices(2))
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		var out []string
		for _, al := range a.Allocations() {
			if al.Share != nil && al.Share.Mode == allocator.ShareTime {
				out = append(out, al.Owner)
			}
		}
		return out
	}
	check := func(name string) {
		t.Helper()
		s := parseSeen(podOutput(t, c, name))
		s.check(t, all, []int{byUUID[gpu.UUID]}, []string{gpu.UUID})
	}
	createPod(t, c, withGPUs(probePod("slice-a", isolationArgs(major, all, true)), shared, 1))
	createPod(t, c, withGPUs(probePod("slice-b", isolationArgs(major, all, true)), shared, 1))
	check("slice-a")
	check("slice-b")
	if got := timeSlices(); len(got) != 2 {
		t.Errorf("the allocator holds time slices %v, want two", got)
	}
	createPod(t, c, withGPUs(probePod("slice-c", isolationArgs(major, all, true)), shared, 1))
	until(t, "slice-c to be unschedulable", func() bool { return unschedulable(pod(t, c, "slice-c")) })
	deletePod(t, c, "slice-a")
	check("slice-c")
	deletePod(t, c, "slice-b")
	deletePod(t, c, "slice-c")
	until(t, "the time slices to be given back", func() bool { return len(timeSlices()) == 0 })
}
