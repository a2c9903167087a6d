package containerizer_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
)

func TestParseCPUAffinity(t *testing.T) {
	for in, want := range map[string]containerizer.CPUAffinity{"": containerizer.CPUAffinityNone, "none": containerizer.CPUAffinityNone, "numa": containerizer.CPUAffinityNUMA} {
		if got, err := containerizer.ParseCPUAffinity(in); err != nil || got != want {
			t.Errorf("ParseCPUAffinity(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"NUMA", "socket", " numa"} {
		if _, err := containerizer.ParseCPUAffinity(in); !errors.Is(err, containerizer.ErrInvalidSpec) {
			t.Errorf("ParseCPUAffinity(%q) = %v, want ErrInvalidSpec", in, err)
		}
	}
}

// TestPrepareCPUAffinity: a spec asking for CPUAffinityNUMA gets a plan
// pinned to its GPU's NUMA node as the sys root lists it (dgx1-volta's GPU
// 4 hangs off node 1); the default pins nothing; a bad affinity is refused
// and holds nothing.
func TestPrepareCPUAffinity(t *testing.T) {
	inv, alloc := simAllocator(t, "dgx1-volta")
	sys := t.TempDir()
	for n, cpus := range []string{"0-19,40-59", "20-39,60-79"} {
		dir := filepath.Join(sys, "devices", "system", "node", "node"+string(rune('0'+n)))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "cpulist"), []byte(cpus+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for i := range inv.Devices {
		inv.Devices[i].Node.Path = "/dev/" + inv.Devices[i].NodeName()
	}
	pr := containerizer.Preparer{Allocator: alloc, SysRoot: sys}
	ctx := context.Background()
	for _, tc := range []struct {
		name       string
		affinity   containerizer.CPUAffinity
		cpus, mems string
	}{
		{"numa", containerizer.CPUAffinityNUMA, "20-39,60-79", "1"},
		{"none", containerizer.CPUAffinityNone, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := pr.Prepare(ctx, containerizer.Spec{ID: "ct-" + tc.name, GPUs: allocator.Request{Devices: []string{"4"}}, CPUAffinity: tc.affinity}, containerizer.Image{})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Undo(ctx)
			if p.Plan.CPUs != tc.cpus || p.Plan.Mems != tc.mems {
				t.Errorf("plan CPUs %q, Mems %q; want %q, %q", p.Plan.CPUs, p.Plan.Mems, tc.cpus, tc.mems)
			}
		})
	}
	if _, err := pr.Prepare(ctx, containerizer.Spec{ID: "ct-bad", GPUs: allocator.Request{Count: 1}, CPUAffinity: "socket"}, containerizer.Image{}); !errors.Is(err, containerizer.ErrInvalidSpec) {
		t.Fatalf("Prepare with CPU affinity %q = %v, want ErrInvalidSpec", "socket", err)
	}
	if _, err := alloc.Allocation("ct-bad"); !errors.Is(err, allocator.ErrUnknownOwner) {
		t.Fatalf("a refused spec holds an allocation (%v)", err)
	}
}
