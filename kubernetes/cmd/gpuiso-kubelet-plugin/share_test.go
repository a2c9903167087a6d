package main

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/kubernetes/deviceplugin"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
)

// TestSharedUUIDs: --shared-gpus names GPUs by index or UUID, or all of
// them; a GPU the node lacks or one split by MIG is refused.
func TestSharedUUIDs(t *testing.T) {
	inv := func(name string) *node.Inventory {
		sim, err := simnode.New(name)
		if err != nil {
			t.Fatal(err)
		}
		inv, err := nvmlnode.Discover(context.Background(), append(sim.DiscoverOptions(nil),
			nvmlnode.WithDevRoot(t.TempDir()), nvmlnode.WithProcRoot(t.TempDir()), nvmlnode.WithSysRoot(t.TempDir()))...)
		if err != nil {
			t.Fatal(err)
		}
		return inv
	}
	volta, mig := inv("dgx1-volta"), inv("hgx-h100-mig")
	var migSplit, whole []int
	for p, d := range mig.Devices {
		if d.MIGSplit() {
			migSplit = append(migSplit, p)
		} else {
			whole = append(whole, p)
		}
	}
	if len(migSplit) == 0 || len(whole) == 0 {
		t.Fatalf("hgx-h100-mig: %d GPUs split by MIG, %d whole", len(migSplit), len(whole))
	}
	tests := []struct {
		name string
		inv  *node.Inventory
		list string
		want []int // positions
		bad  bool
	}{
		{name: "none", inv: volta, list: ""},
		{name: "indexes", inv: volta, list: "3, 0", want: []int{0, 3}},
		{name: "a UUID", inv: volta, list: strings.ToLower(volta.Devices[5].UUID), want: []int{5}},
		{name: "all", inv: volta, list: "all", want: []int{0, 1, 2, 3, 4, 5, 6, 7}},
		{name: "all but MIG", inv: mig, list: "all", want: whole},
		{name: "unknown", inv: volta, list: "0,9", bad: true},
		{name: "MIG", inv: mig, list: "0," + mig.Devices[migSplit[0]].UUID, bad: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := sharedUUIDs(tt.inv, tt.list)
			if tt.bad {
				if !errors.Is(err, errSharedGPU) || !errors.Is(err, node.ErrInvalid) {
					t.Fatalf("err = %v, want errSharedGPU", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var want []string
			for _, p := range tt.want {
				want = append(want, tt.inv.Devices[p].UUID)
			}
			if !slices.Equal(got, want) {
				t.Errorf("got %v, want %v", got, want)
			}
		})
	}
}

// TestShareFlags: bad share flags exit 2 with a reason.
func TestShareFlags(t *testing.T) {
	for name, args := range map[string][]string{
		"--share-min":                 {"--shared-gpus", "0", "--share-min", "lots"},
		"--share-step":                {"--shared-gpus", "0", "--share-step", "0"},
		"--time-slices":               {"--shared-gpus", "0", "--time-slices", "0"},
		"--mps-control":               {"--shared-gpus", "0", "--mps-control", "relative/bin"},
		"--mps-driver-root":           {"--shared-gpus", "0", "--mps-driver-root", "driver"},
		"--mps-cgroup-parent":         {"--shared-gpus", "0", "--mps-cgroup-parent", "kubepods/../.."},
		"--mps-cgroup-root":           {"--shared-gpus", "0", "--mps-cgroup-root", "sys/fs/cgroup"},
		"--mps-shm-size":              {"--shared-gpus", "0", "--mps-shm-size", "0"},
		"--mps-mount-namespace":       {"--shared-gpus", "0", "--mps-mount-namespace", "node"},
		"--mps-namespace-driver-root": {"--shared-gpus", "0", "--mps-namespace-driver-root", "driver"},
		"--device-plugin-sharing":     {"--shared-gpus", "0", "--device-plugin-sharing", "spatial"},
		"--device-plugin-sharing=mps": {"--shared-gpus", "0", "--device-plugin-sharing", "mps", "--time-slices", "1"},
	} {
		var out bytes.Buffer
		_, code, done := parse(args, &out)
		if !done || code != 2 || !strings.Contains(out.String(), name) {
			t.Errorf("%v: %d, %v, %q", args, code, done, out.String())
		}
	}
	var out bytes.Buffer
	f, _, done := parse([]string{"--shared-gpus", "all", "--share-min", "2Gi", "--share-step", "512Mi"}, &out)
	if done {
		t.Fatalf("refused: %s", out.String())
	}
	if least, step := f.share.sizes(); least != 2<<30 || step != 512<<20 {
		t.Errorf("sizes %d, %d", least, step)
	}
	if got := f.share.dpStrategy(); got != deviceplugin.StrategyTimeSlicing {
		t.Errorf("the device plugin's sharing is %q by default, want time slicing", got)
	}
	f, _, done = parse([]string{"--shared-gpus", "all", "--device-plugin-sharing", "mps", "--time-slices", "48"}, &out)
	if done {
		t.Fatalf("refused: %s", out.String())
	}
	if got := f.share.dpStrategy(); got != deviceplugin.StrategyMPS {
		t.Errorf("--device-plugin-sharing=mps gives %q", got)
	}
}

// TestKubepodsParent: the daemons' cgroup parent is the parent of the
// first kubepods cgroup of the plugin's own, with either cgroup driver,
// the unified hierarchy's path first; none is found in a cgroup namespace
// of the pod's own (rooted at its container: "/") or outside a pod.
func TestKubepodsParent(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cgroups map[string]string
		want    string
		ok      bool
	}{
		{"cgroupfs under a root", map[string]string{"": "/", "memory": "/k8s/n1/kubepods/burstable/pod1/c1", "cpu": "/k8s/n1/kubepods/burstable/pod1/c1"}, "/k8s/n1", true},
		{"cgroupfs at the top", map[string]string{"": "/kubepods/besteffort/pod1/c1"}, "/", true},
		{"systemd", map[string]string{"": "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice/cri-containerd-c1.scope"}, "/", true},
		{"unified first", map[string]string{"": "/a/kubepods/pod1/c1", "memory": "/b/kubepods/pod1/c1"}, "/a", true},
		{"a namespace of the pod's own", map[string]string{"": "/"}, "", false},
		{"outside a pod", map[string]string{"": "/user.slice/session-1.scope", "memory": "/user.slice"}, "", false},
		{"a name that only starts so", map[string]string{"": "/kubepodsx/c1"}, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := kubepodsParent(tc.cgroups)
			if got != tc.want || ok != tc.ok {
				t.Errorf("got %q, %v; want %q, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}
