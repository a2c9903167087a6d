package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// TestDRAReboot: a claim prepared before a reboot of its node runs its pod
// after it. A pod (restartPolicy Always, as a workload's) runs with a
// claim for one GPU; the plugin stops and the node reboots
// (cluster.Reboot: kubelet, containerd, shims and the pod's processes
// killed, the CDI spec directory and the rest of the node's /run emptied,
// the checkpoints and the kubelet's state kept). The plugin starts again;
// the kubelet starts the pod's container again with the same claim, and
// from inside it sees exactly its GPU, the claim's CDI spec written back
// as it was, and its device metadata file describes the GPU again.
func TestDRAReboot(t *testing.T) {
	c := requireCluster(t)
	ensureClasses(t, c)
	p := startPlugin(t, c, "dgx1-volta", "--device-plugin=false")
	inv := p.inventory()
	_, all := minorsOf(inv)
	major := p.major()
	until(t, "the slice's 8 GPUs", func() bool { return len(sliceDevices(t, c)) == 8 })
	slice := sliceByName(t, c)

	claimTemplate(t, c, "one-gpu-boot", "gpu.gpuiso.io", 1, "")
	pd := withClaim(probePod("rebooted", isolationArgs(major, all, true, metadataStep()...)), "one-gpu-boot")
	pd.Spec.RestartPolicy = corev1.RestartPolicyAlways
	createPod(t, c, pd)
	out := podOutput(t, c, "rebooted")
	s := parseSeen(out)
	_, uuids, minors := allocated(t, c, "rebooted", slice)
	if len(uuids) != 1 {
		t.Fatalf("allocated %v", uuids)
	}
	s.check(t, all, minors, uuids)
	checkMetadata(t, out, inv, uuids)
	claim := claimOf(t, c, "rebooted")
	uid := string(claim.UID)
	spec := filepath.Join(c.CDIDir, driver+"-claim_alloc-claim-"+uid+".json")
	checkpoint := filepath.Join(p.stateDir, "claims", uid+".json")
	written, err := os.ReadFile(spec)
	if err != nil {
		t.Fatalf("the prepared claim's CDI spec: %v", err)
	}
	before := pod(t, c, "rebooted").Status.ContainerStatuses[0].ContainerID

	p.stop()
	start := time.Now()
	if err := c.Reboot(t.Context(), c.Nodes[0]); err != nil {
		t.Fatal(err)
	}
	t.Logf("node %s rebooted in %v", c.Nodes[0].Name, time.Since(start).Round(time.Millisecond))
	if _, err := os.Stat(spec); !os.IsNotExist(err) {
		t.Fatalf("the reboot left the claim's CDI spec: %v", err)
	}
	if _, err := os.Stat(checkpoint); err != nil {
		t.Fatalf("the reboot lost the claim's checkpoint: %v", err)
	}
	p.start()

	// The kubelet starts the container again once the plugin is back;
	// without the claim's CDI spec, containerd cannot create it.
	var last string
	deadline := time.Now().Add(2 * time.Minute)
	for {
		st := pod(t, c, "rebooted").Status.ContainerStatuses
		if len(st) == 1 && st[0].ContainerID != before && st[0].State.Running != nil {
			break
		}
		if len(st) == 1 {
			last = fmt.Sprintf("%+v", st[0].State)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pod's container did not run again after the reboot; last state %s", last)
		}
		time.Sleep(200 * time.Millisecond)
	}
	out = podOutput(t, c, "rebooted")
	after := parseSeen(out)
	after.check(t, all, minors, uuids)
	checkMetadata(t, out, inv, uuids)
	if again := claimOf(t, c, "rebooted"); again.UID != claim.UID {
		t.Errorf("the pod's claim changed over the reboot: %s, was %s", again.UID, claim.UID)
	}
	if got, err := os.ReadFile(spec); err != nil || !slices.Equal(got, written) {
		t.Errorf("the claim's CDI spec after the reboot (%v):\n%s\nwant:\n%s", err, got, written)
	}

	// Deleting the pod unprepares the claim as usual.
	deletePod(t, c, "rebooted")
	until(t, "the claim's CDI spec and checkpoint to go", func() bool {
		_, err1 := os.Stat(spec)
		_, err2 := os.Stat(checkpoint)
		return os.IsNotExist(err1) && os.IsNotExist(err2)
	})
}
