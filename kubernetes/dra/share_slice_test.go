package dra_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/gpuiso/gpuiso/kubernetes/dra"
)

// TestSliceSharesGolden: a node whose GPUs 0 and 5 are shared publishes
// them as share devices only (consumable memory, allowMultipleAllocations,
// the default request policy) and the six others whole, against
// testdata/dgx1-volta-shared.slice.json (go test -update rewrites).
func TestSliceSharesGolden(t *testing.T) {
	_, inv := inventory(t, "dgx1-volta")
	opts := dra.SliceOptions{PCIeRoot: fakeRoot, Shared: []string{inv.Devices[0].UUID, inv.Devices[5].UUID}}
	got, err := json.MarshalIndent(dra.Devices(inv, inv.Devices, opts), "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, '\n')
	golden := filepath.Join("testdata", "dgx1-volta-shared.slice.json")
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Errorf("slice differs from %s (go test -update to accept):\n%s", golden, got)
	}
}

// TestSliceShares: what a share device holds, with the default and with a
// given request policy; a shared GPU is never published whole, an
// unhealthy one not at all, and one too small for the least share and a
// step is left out.
func TestSliceShares(t *testing.T) {
	_, inv := inventory(t, "dgx1-volta")
	uuid := inv.Devices[2].UUID
	tests := []struct {
		name           string
		opts           dra.SliceOptions
		memory         uint64 // the GPU's, 0: as simulated
		healthy        bool
		want           bool
		wantMin, wantS int64
	}{
		{name: "default policy", opts: dra.SliceOptions{Shared: []string{uuid}}, healthy: true, want: true, wantMin: 1 << 30, wantS: 256 << 20},
		{name: "given policy", opts: dra.SliceOptions{Shared: []string{uuid}, ShareMin: 2 << 30, ShareStep: 1 << 30}, healthy: true, want: true, wantMin: 2 << 30, wantS: 1 << 30},
		{name: "unhealthy", opts: dra.SliceOptions{Shared: []string{uuid}}, want: false},
		{name: "too small", opts: dra.SliceOptions{Shared: []string{uuid}}, memory: 1<<30 + 255<<20, healthy: true, want: false},
		{name: "just large enough", opts: dra.SliceOptions{Shared: []string{uuid}}, memory: 1<<30 + 256<<20, healthy: true, want: true, wantMin: 1 << 30, wantS: 256 << 20},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			devs := inv.Clone().Devices
			if tt.memory > 0 {
				devs[2].MemoryBytes = tt.memory
			}
			if !tt.healthy {
				devs[2].Health.Healthy = false
			}
			var found bool
			for _, d := range dra.Devices(inv, devs, tt.opts) {
				if d.Name == "gpu-2" {
					t.Errorf("the shared GPU is published whole")
				}
				if d.Name != "share-2" {
					continue
				}
				found = true
				if v := d.Attributes["type"].StringValue; v == nil || *v != "share" {
					t.Errorf("type %v, want share", v)
				}
				if v := d.Attributes["uuid"].StringValue; v == nil || *v != uuid {
					t.Errorf("uuid %v, want %s", v, uuid)
				}
				if d.AllowMultipleAllocations == nil || !*d.AllowMultipleAllocations {
					t.Errorf("allowMultipleAllocations %v", d.AllowMultipleAllocations)
				}
				c := d.Capacity["memory"]
				if c.Value.Value() != int64(devs[2].MemoryBytes) {
					t.Errorf("memory %s, want %d", c.Value.String(), devs[2].MemoryBytes)
				}
				p := c.RequestPolicy
				if p == nil || p.ValidRange == nil || p.Default == nil || p.ValidRange.Min == nil || p.ValidRange.Step == nil || p.ValidRange.Max != nil {
					t.Fatalf("request policy %+v", p)
				}
				if p.Default.Value() != tt.wantMin || p.ValidRange.Min.Value() != tt.wantMin || p.ValidRange.Step.Value() != tt.wantS {
					t.Errorf("policy default %s, min %s, step %s; want %d, %d", p.Default, p.ValidRange.Min, p.ValidRange.Step, tt.wantMin, tt.wantS)
				}
			}
			if found != tt.want {
				t.Errorf("share-2 published: %v, want %v", found, tt.want)
			}
		})
	}
}
