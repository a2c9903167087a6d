package dra_test

import (
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpuiso/gpuiso/kubernetes/dra"
)

func names(devs []resourceapi.Device) string {
	var out []string
	for _, d := range devs {
		out = append(out, d.Name)
	}
	return strings.Join(out, " ")
}

// TestPreferredOrder: the scheduler's first fit over the ordered slice
// gives a request for n GPUs n GPUs of one NVLink clique whenever a clique
// has n free: the clique with the most free GPUs comes first, its free
// GPUs before its busy or tainted ones; GPUs of no clique and other
// devices follow; nothing but the order changes.
func TestPreferredOrder(t *testing.T) {
	_, inv := inventory(t, "dgx1-volta") // cliques 0-3 and 4-7
	devs := dra.Devices(inv, inv.Devices, dra.SliceOptions{})
	busyOf := func(idx ...int64) func(int64) bool { return func(i int64) bool { return slices.Contains(idx, i) } }
	tests := []struct {
		name  string
		busy  func(int64) bool
		taint []string
		want  string
	}{
		{"all free", busyOf(), nil, "gpu-0 gpu-1 gpu-2 gpu-3 gpu-4 gpu-5 gpu-6 gpu-7"},
		{"three of the first clique held", busyOf(0, 1, 2), nil, "gpu-4 gpu-5 gpu-6 gpu-7 gpu-3 gpu-0 gpu-1 gpu-2"},
		{"one held in each, then more", busyOf(4, 0, 5), nil, "gpu-1 gpu-2 gpu-3 gpu-0 gpu-6 gpu-7 gpu-4 gpu-5"},
		{"tainted is busy", busyOf(0), []string{"gpu-1", "gpu-4"}, "gpu-5 gpu-6 gpu-7 gpu-4 gpu-2 gpu-3 gpu-0 gpu-1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := slices.Clone(devs)
			for i := range in {
				if slices.Contains(tt.taint, in[i].Name) {
					in[i].Taints = []resourceapi.DeviceTaint{{Key: "gpu.gpuiso.io/unhealthy", Effect: resourceapi.DeviceTaintEffectNoSchedule}}
				}
			}
			got := dra.PreferredOrder(in, tt.busy)
			if names(got) != tt.want {
				t.Errorf("order %s, want %s", names(got), tt.want)
			}
		})
	}

	// GPUs of no clique, MIG devices: after the cliques, in their order.
	_, mig := inventory(t, "hgx-h100-mig")
	mdevs := dra.Devices(mig, mig.Devices, dra.SliceOptions{})
	got := dra.PreferredOrder(mdevs, busyOf())
	if len(got) != len(mdevs) {
		t.Fatalf("%d devices, want %d", len(got), len(mdevs))
	}
	var wantTail []string
	for _, d := range mdevs {
		if d.Attributes[dra.AttrNVLinkClique].StringValue == nil {
			wantTail = append(wantTail, d.Name)
		}
	}
	if tail := names(got[len(got)-len(wantTail):]); tail != strings.Join(wantTail, " ") {
		t.Errorf("devices of no clique %s, want %s", tail, strings.Join(wantTail, " "))
	}
}

// TestResourcesOrder: the driver publishes its slice in that order, the
// GPUs its prepared claims hold being busy.
func TestResourcesOrder(t *testing.T) {
	e := newEnv(t, "dgx1-volta")
	d, _ := e.driver(t)
	if _, err := d.Prepare(t.Context(), claim("three", "gpu-0", "gpu-1", "gpu-2")); err != nil {
		t.Fatal(err)
	}
	res := d.Resources("node-1")
	got := names(res.Pools["node-1"].Slices[0].Devices)
	if want := "gpu-4 gpu-5 gpu-6 gpu-7 gpu-3 gpu-0 gpu-1 gpu-2"; got != want {
		t.Errorf("slice order %s, want %s", got, want)
	}
	if err := d.Unprepare(t.Context(), "three"); err != nil {
		t.Fatal(err)
	}
	if got := names(d.Resources("node-1").Pools["node-1"].Slices[0].Devices); got != "gpu-0 gpu-1 gpu-2 gpu-3 gpu-4 gpu-5 gpu-6 gpu-7" {
		t.Errorf("slice order after unprepare %s", got)
	}
}
