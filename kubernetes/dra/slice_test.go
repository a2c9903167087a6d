package dra_test

import (
	"context"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/kubernetes/dra"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// inventory discovers a simulated node without its host tree (no root):
// the slice needs no device node. Driver and CUDA versions are fixed so
// the golden files do not depend on the host's driver.
func inventory(t testing.TB, name string) (*simnode.Node, *node.Inventory) {
	t.Helper()
	sim, err := simnode.New(name, simnode.WithDriverVersion("550.127.05"), simnode.WithCUDAVersion(12040))
	if err != nil {
		t.Fatal(err)
	}
	inv, err := nvmlnode.Discover(context.Background(), append(sim.DiscoverOptions(nil),
		nvmlnode.WithDevRoot(t.TempDir()), nvmlnode.WithProcRoot(t.TempDir()), nvmlnode.WithSysRoot(t.TempDir()))...)
	if err != nil {
		t.Fatal(err)
	}
	return sim, inv
}

// fakeRoot stands for sysfs: the root complex of a bus id's domain and bus.
func fakeRoot(busID string) (string, bool) {
	parts := strings.Split(busID, ":")
	if len(parts) != 3 {
		return "", false
	}
	return "pci" + parts[0] + ":" + parts[1], true
}

// TestSliceGolden: the published devices of each node, attributes and
// capacity, against testdata/<node>.slice.json (go test -update rewrites).
func TestSliceGolden(t *testing.T) {
	for _, name := range []string{"dgx1-volta", "hgx-h100-mig", "pcie8"} {
		t.Run(name, func(t *testing.T) {
			_, inv := inventory(t, name)
			got, err := json.MarshalIndent(dra.Devices(inv, inv.Devices, dra.SliceOptions{PCIeRoot: fakeRoot}), "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, '\n')
			golden := filepath.Join("testdata", name+".slice.json")
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
				t.Errorf("slice of %s differs from %s (go test -update to accept):\n%s", name, golden, got)
			}
		})
	}
}

// TestSliceHealth: a GPU the allocator holds unhealthy leaves the slice,
// and comes back when healthy again.
func TestSliceHealth(t *testing.T) {
	_, inv := inventory(t, "dgx1-volta")
	a, err := allocator.New(inv)
	if err != nil {
		t.Fatal(err)
	}
	has := func(name string) bool {
		for _, d := range dra.Devices(inv, a.Devices(), dra.SliceOptions{}) {
			if d.Name == name {
				return true
			}
		}
		return false
	}
	if !has("gpu-2") {
		t.Fatal("gpu-2 missing at first")
	}
	if _, err := a.MarkUnhealthy(t.Context(), inv.Devices[2].UUID, "xid 79"); err != nil {
		t.Fatal(err)
	}
	if has("gpu-2") {
		t.Error("an unhealthy gpu-2 is published")
	}
	if err := a.MarkHealthy(t.Context(), inv.Devices[2].UUID); err != nil {
		t.Fatal(err)
	}
	if !has("gpu-2") {
		t.Error("gpu-2 not published again")
	}
}

// TestNVLinkCliques: members of a clique are NVLinked pairwise, and each
// multi-GPU node with NVLinks has a clique of at least two.
func TestNVLinkCliques(t *testing.T) {
	tests := []struct {
		name     string
		sim      string
		wantSize int // the largest clique
	}{
		{name: "hybrid cube mesh", sim: "dgx1-volta", wantSize: 4},
		{name: "NVSwitch", sim: "hgx-h100", wantSize: 8},
		{name: "no NVLink", sim: "pcie8", wantSize: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, inv := inventory(t, tt.sim)
			cl := dra.NVLinkCliques(inv)
			groups := map[string][]int{}
			for p, c := range cl {
				groups[c] = append(groups[c], p)
			}
			largest := 0
			for c, members := range groups {
				largest = max(largest, len(members))
				for _, i := range members {
					for _, j := range members {
						if i != j && inv.Topology.Link(i, j).NVLinks == 0 {
							t.Errorf("%s: GPUs %d and %d are not NVLinked", c, i, j)
						}
					}
				}
			}
			if largest != tt.wantSize {
				t.Errorf("largest clique %d, want %d (%v)", largest, tt.wantSize, groups)
			}
		})
	}
}
