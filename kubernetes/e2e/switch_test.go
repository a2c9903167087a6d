package e2e

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/kubernetes/deviceplugin"
)

// TestDevicePluginToDRA serves a simulated DGX-1 (Volta) through the device
// plugin (nvidia.com/gpu) and the DRA driver side by side, then restarts
// the plugin with the device plugin off, as turning the chart's
// devicePlugin.enabled off does, without a drain:
//   - side by side, the two GPUs of a device plugin pod are tainted held in
//     the slice, and three pods with a one-GPU claim each get another GPU;
//   - a pod of the device plugin's gets all eight GPUs, and the allocator
//     holds each for it;
//   - the plugin restarts with the device plugin off over the allocator's
//     state as a release that held no GPU of the device plugin's left it;
//     it finds the pod's GPUs through the kubelet's pod-resources service
//     and holds them again;
//   - the slice shows those GPUs tainted held (NoSchedule), and a pod with
//     a claim of one GPU is not scheduled while the device plugin's pod
//     runs: no GPU is handed out twice;
//   - once that pod ends, the claim's pod starts with one GPU, isolated.
func TestDevicePluginToDRA(t *testing.T) {
	c := requireCluster(t)
	ensureClasses(t, c)
	p := startPlugin(t, c, "dgx1-volta", "--device-plugin", "--extended-resource-name=")
	inv := p.inventory()
	byUUID, all := minorsOf(inv)
	major := p.major()
	until(t, "8 allocatable GPUs", func() bool { return allocatable(t, c, gpuResource) == 8 })

	held := func() []string {
		a, err := allocator.New(inv, allocator.WithStateDir(p.stateDir+"/allocator"))
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		var out []string
		for _, al := range a.Allocations() {
			if strings.HasPrefix(al.Owner, "deviceplugin-") {
				out = append(out, al.Owner)
			}
		}
		slices.Sort(out)
		return out
	}
	var want []string
	for _, d := range inv.Devices {
		want = append(want, deviceplugin.DeviceOwner(d.UUID))
	}
	slices.Sort(want)

	// Side by side: a claim gets none of the GPUs a device plugin pod has.
	claimTemplate(t, c, "switch-one", "gpu.gpuiso.io", 1, "")
	createPod(t, c, withGPUs(probePod("dp-two", isolationArgs(major, all, true)), gpuResource, 2))
	two := strings.Split(parseSeen(podOutput(t, c, "dp-two")).env["NVIDIA_VISIBLE_DEVICES"], ",")
	until(t, "the device plugin pod's two GPUs tainted held", func() bool {
		n := 0
		for _, ts := range sliceTaints(t, c) {
			if slices.ContainsFunc(ts, func(tt resourceapi.DeviceTaint) bool { return tt.Key == driver+"/held" }) {
				n++
			}
		}
		return n == 2
	})
	for i := range 3 {
		name := fmt.Sprintf("beside-%d", i)
		createPod(t, c, withClaim(probePod(name, isolationArgs(major, all, true)), "switch-one"))
		got := parseSeen(podOutput(t, c, name)).env["NVIDIA_VISIBLE_DEVICES"]
		if slices.Contains(two, got) {
			t.Fatalf("claim pod %s got %s, a GPU of the device plugin's pod (%v)", name, got, two)
		}
	}
	for _, name := range []string{"dp-two", "beside-0", "beside-1", "beside-2"} {
		deletePod(t, c, name)
	}
	until(t, "the device plugin's holds given back", func() bool { return len(held()) == 0 })

	createPod(t, c, withGPUs(probePod("dp-eight", isolationArgs(major, all, true)), gpuResource, 8))
	s := parseSeen(podOutput(t, c, "dp-eight"))
	if n := len(strings.Split(s.env["NVIDIA_VISIBLE_DEVICES"], ",")); n != 8 {
		t.Fatalf("the device plugin's pod got %q", s.env["NVIDIA_VISIBLE_DEVICES"])
	}
	if got := held(); !slices.Equal(got, want) {
		t.Fatalf("the allocator holds %v for the device plugin's pod, want %v", got, want)
	}

	// The plugin restarts with the device plugin off, over a state in
	// which nothing holds the pod's GPUs.
	p.stop()
	a, err := allocator.New(inv, allocator.WithStateDir(p.stateDir+"/allocator"))
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range want {
		if err := a.Release(t.Context(), o); err != nil {
			t.Fatal(err)
		}
	}
	a.Close()
	for i, arg := range p.args {
		if arg == "--device-plugin" {
			p.args[i] = "--device-plugin=false"
		}
	}
	p.start()
	until(t, "the device plugin's pod's GPUs held again", func() bool { return slices.Equal(held(), want) })

	until(t, "every GPU of the slice tainted held", func() bool {
		taints := sliceTaints(t, c)
		n := 0
		for _, ts := range taints {
			if slices.ContainsFunc(ts, func(tt resourceapi.DeviceTaint) bool { return tt.Key == driver+"/held" }) {
				n++
			}
		}
		return n == 8
	})
	createPod(t, c, withClaim(probePod("claimer", isolationArgs(major, all, true)), "switch-one"))
	until(t, "the claim's pod to be unschedulable", func() bool { return unschedulable(pod(t, c, "claimer")) })
	if ph := pod(t, c, "claimer").Status.Phase; ph != corev1.PodPending {
		t.Fatalf("the claim's pod is %s while the device plugin's pod holds every GPU", ph)
	}
	deletePod(t, c, "dp-eight")
	s = parseSeen(podOutput(t, c, "claimer"))
	uuids := strings.Split(s.env["NVIDIA_VISIBLE_DEVICES"], ",")
	if len(uuids) != 1 {
		t.Fatalf("the claim's pod got %q, want one GPU", s.env["NVIDIA_VISIBLE_DEVICES"])
	}
	s.check(t, all, []int{byUUID[uuids[0]]}, uuids)
	until(t, "the device plugin's holds given back", func() bool { return len(held()) == 0 })
}
