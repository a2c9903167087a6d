package e2e

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/simnode"
)

// TestDRAHealthReset: with --gpu-reset, an XID that needs a GPU reset
// (109) on a GPU a running pod holds taints it NoExecute; the cluster
// evicts the pod, the plugin resets the GPU once its claim is gone and
// publishes it untainted; a new pod's claim gets that GPU and runs,
// while a pod on another GPU of the node runs on, never restarted. The
// times from the fault to each step are logged.
func TestDRAHealthReset(t *testing.T) {
	c := requireCluster(t)
	ensureClasses(t, c)
	p := startPlugin(t, c, "dgx1-volta", "--device-plugin=false", "--gpu-reset", "--health-period", "1s")
	inv := p.inventory()
	until(t, "the slice's 8 GPUs", func() bool { return len(sliceDevices(t, c)) == 8 })
	const faulty, other = 2, 5
	onGPU := func(name string, i int) {
		claimTemplate(t, c, name, "gpu.gpuiso.io", 1, "", `device.attributes["gpu.gpuiso.io"].uuid == "`+inv.Devices[i].UUID+`"`)
	}
	onGPU("reset-faulty", faulty)
	onGPU("reset-other", other)
	createPod(t, c, withClaim(sleeper("default", "reset-victim"), "reset-faulty"))
	createPod(t, c, withClaim(sleeper("default", "reset-bystander"), "reset-other"))
	victimUID := running(t, c, "default", "reset-victim").UID
	bystander := running(t, c, "default", "reset-bystander")

	injector, err := simnode.New("dgx1-volta")
	if err != nil {
		t.Fatal(err)
	}
	host := &simnode.Host{Root: p.devRoot, DevRoot: filepath.Join(p.devRoot, "dev"), ProcRoot: filepath.Join(p.devRoot, "proc"), SysRoot: filepath.Join(p.devRoot, "sys")}
	if err := injector.ShareFaults(host); err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("gpu-%d", faulty)
	start := time.Now()
	if err := injector.Inject(faulty, node.Signal{Kind: node.SignalXID, Value: 109}); err != nil {
		t.Fatal(err)
	}
	until(t, name+" tainted NoExecute", func() bool {
		return tainted(sliceTaints(t, c)[name], "xid-109", resourceapi.DeviceTaintEffectNoExecute)
	})
	taintedAt := time.Since(start)
	until(t, "the pod on the faulty GPU to be evicted", func() bool {
		v, err := c.Client.CoreV1().Pods("default").Get(t.Context(), "reset-victim", metav1.GetOptions{})
		return apierrors.IsNotFound(err) || err == nil && (v.UID != victimUID || v.DeletionTimestamp != nil)
	})
	evictedAt := time.Since(start)
	until(t, "the faulty GPU's reset", func() bool { return injector.Resets(faulty) >= 1 })
	resetAt := time.Since(start)
	until(t, name+"'s taint to go", func() bool { return len(sliceTaints(t, c)[name]) == 0 })
	offeredAt := time.Since(start)

	deletePod(t, c, "reset-victim")
	createPod(t, c, withClaim(sleeper("default", "reset-next"), "reset-faulty"))
	running(t, c, "default", "reset-next")
	runningAt := time.Since(start)
	res := claimOf(t, c, "reset-next").Status.Allocation.Devices.Results
	if len(res) != 1 || res[0].Device != name {
		t.Errorf("the new pod's claim got %+v, want %s", res, name)
	}

	b := pod(t, c, "reset-bystander")
	if b.UID != bystander.UID || b.DeletionTimestamp != nil || len(b.Status.ContainerStatuses) != 1 || b.Status.ContainerStatuses[0].RestartCount != 0 || b.Status.ContainerStatuses[0].State.Running == nil {
		t.Errorf("the pod on another GPU was touched: %+v", b.Status)
	}
	if n := injector.Resets(other); n != 0 {
		t.Errorf("the other GPU was reset %d times", n)
	}
	if n := injector.Resets(faulty); n != 1 {
		t.Errorf("the faulty GPU was reset %d times, want 1", n)
	}
	t.Logf("from XID 109 on a held GPU: tainted NoExecute %s, pod evicted %s, GPU reset %s, untainted %s, a new pod running on it %s",
		taintedAt.Round(time.Millisecond), evictedAt.Round(time.Millisecond), resetAt.Round(time.Millisecond), offeredAt.Round(time.Millisecond), runningAt.Round(time.Millisecond))
}
