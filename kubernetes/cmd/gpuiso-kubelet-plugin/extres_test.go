package main

import (
	"bytes"
	"strings"
	"testing"

	"k8s.io/utils/ptr"

	"github.com/gpuiso/gpuiso/kubernetes/dra"
)

// TestServingDefaults: with credentials and the DRA driver on, the device
// plugin is off unless asked for; serving one resource name from the
// device plugin and through the DRA driver's DeviceClass is refused with
// the reason.
func TestServingDefaults(t *testing.T) {
	tests := []struct {
		name      string
		args      []string
		plugin    bool
		dra       bool
		refusedBy string
	}{
		{name: "no credentials", args: nil, plugin: true, dra: true},
		{name: "kubeconfig", args: []string{"--kubeconfig", "k"}, plugin: false, dra: true},
		{name: "in cluster", args: []string{"--in-cluster"}, plugin: false, dra: true},
		{name: "kubeconfig without DRA", args: []string{"--kubeconfig", "k", "--dra=false"}, plugin: true, dra: false},
		{name: "device plugin asked, same name", args: []string{"--kubeconfig", "k", "--device-plugin"},
			refusedBy: "would both serve nvidia.com/gpu on this node"},
		{name: "device plugin asked, same name, in cluster", args: []string{"--in-cluster", "--device-plugin=true",
			"--resource-name", "example.com/gpu", "--extended-resource-name", "example.com/gpu"}, refusedBy: "would both serve example.com/gpu"},
		{name: "device plugin asked, another name", args: []string{"--kubeconfig", "k", "--device-plugin", "--resource-name", "nvidia.com/gpu.dp"},
			plugin: true, dra: true},
		{name: "device plugin asked, no class name", args: []string{"--kubeconfig", "k", "--device-plugin", "--extended-resource-name="},
			plugin: true, dra: true},
		{name: "device plugin off asked", args: []string{"--kubeconfig", "k", "--device-plugin=false"}, plugin: false, dra: true},
		{name: "both asked without credentials", args: []string{"--device-plugin"}, plugin: true, dra: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			f, code, done := parse(tt.args, &out)
			if tt.refusedBy != "" {
				if !done || code != 2 || !strings.Contains(out.String(), tt.refusedBy) {
					t.Errorf("parse = %d, %v, %q; want refused with %q", code, done, out.String(), tt.refusedBy)
				}
				return
			}
			if done {
				t.Fatalf("refused: %s", out.String())
			}
			if f.devicePlugin != tt.plugin || f.dra != tt.dra {
				t.Errorf("device plugin %v, DRA %v; want %v, %v", f.devicePlugin, f.dra, tt.plugin, tt.dra)
			}
		})
	}
}

// TestRepublishing: the plugin publishes its slice again after claims are
// prepared or unprepared (the slice's order follows what is held), and
// not before it is told how.
func TestRepublishing(t *testing.T) {
	r := &republishing{Driver: &dra.Driver{}}
	if _, err := r.PrepareResourceClaims(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
	n := 0
	r.publish.Store(ptr.To(func() { n++ }))
	if _, err := r.PrepareResourceClaims(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := r.UnprepareResourceClaims(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Errorf("published %d times after a prepare and an unprepare, want 2", n)
	}
}
