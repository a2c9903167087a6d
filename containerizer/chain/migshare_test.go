package chain

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/isolator/mps"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
)

// TestMIGShare: a memory share of a MIG device prepared by the chain gets
// a daemon serving that MIG device and its directories in the launch's
// plan; Recover after a lost allocator state holds the same share of the
// same MIG device again; Cleanup stops the daemon and frees the MIG device.
func TestMIGShare(t *testing.T) {
	testenv.RequireSimulatedMPS(t)
	ctx := context.Background()
	sim, err := simnode.New("hgx-h100-mig")
	if err != nil {
		t.Fatal(err)
	}
	inv, err := nvmlnode.Discover(ctx, nvmlnode.WithNVML(sim.NVML()))
	if err != nil {
		t.Fatal(err)
	}
	// The capability nodes a MIG device's plan needs, as a driver's
	// /proc/driver/nvidia-caps would name them.
	minor := uint32(10)
	for i := range inv.Devices {
		for j := range inv.Devices[i].MIGDevices {
			md := &inv.Devices[i].MIGDevices[j]
			md.GIAccess = node.DeviceNode{Path: fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", minor), Major: 241, Minor: minor}
			md.CIAccess = node.DeviceNode{Path: fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", minor+1), Major: 241, Minor: minor + 1}
			minor += 2
		}
	}
	f := &fixture{inv: inv, allocDir: t.TempDir(), dir: t.TempDir(), dev: newFakeDevices()}
	m, err := mps.New(filepath.Join(t.TempDir(), "mps"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		m.Sweep(ctx, nil)
		m.Close()
	}()
	open := func() (*Isolator, *allocator.Allocator) {
		a, err := allocator.New(f.inv)
		if err != nil {
			t.Fatal(err)
		}
		return newIsolator(Config{Allocator: a, Inventory: f.inv, StateDir: f.dir, MPS: m}, f.dir, parent, f.dev), a
	}
	iso, _ := open()
	l, err := iso.Prepare(ctx, "job", allocator.Request{MIG: "1g.10gb", Share: &allocator.Share{MemoryBytes: 3 << 30}}, containerizer.Image{})
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Allocation.Devices) != 1 || l.Allocation.Devices[0].MIG == nil || l.Plan.MPS == nil {
		t.Fatalf("launch of a MIG device's share: allocation %+v, plan %+v", l.Allocation, l.Plan)
	}
	mig := l.Allocation.Devices[0].UUID
	ds, _ := m.List(ctx)
	if len(ds) != 1 || ds[0].Owner != "job" || ds[0].GPU != mig || ds[0].Limits.MemoryBytes != 3<<30 || l.Plan.MPS.PipeDir != ds[0].PipeDir {
		t.Fatalf("daemons %+v, want one serving %s", ds, mig)
	}
	if len(l.Plan.Mounts) < 2 || !hasMount(l.Plan, isolator.MPSPipeDir) || !hasMount(l.Plan, isolator.MPSShmDir) {
		t.Fatalf("mounts %+v", l.Plan.Mounts)
	}
	if err := iso.Isolate(ctx, "job", 100); err != nil {
		t.Fatal(err)
	}

	iso2, a2 := open()
	res, err := iso2.Recover(ctx, []string{"job"})
	if err != nil || len(res.Recovered) != 1 {
		t.Fatalf("Recover = %+v, %v", res, err)
	}
	al, err := a2.Allocation("job")
	if err != nil || al.Share == nil || al.Share.MemoryBytes != 3<<30 || al.Devices[0].UUID != mig {
		t.Fatalf("allocation after Recover: %+v, %v", al, err)
	}
	f.dev.procs = map[string][]int{}
	if err := iso2.Cleanup(ctx, "job"); err != nil {
		t.Fatal(err)
	}
	if ds, _ := m.List(ctx); len(ds) != 0 {
		t.Fatalf("daemons after Cleanup: %+v", ds)
	}
	if o, err := a2.Owners(mig); err != nil || len(o) != 0 {
		t.Fatalf("owners of %s after Cleanup: %v, %v", mig, o, err)
	}
}

func hasMount(p *isolator.Plan, dest string) bool {
	for _, m := range p.Mounts {
		if m.Destination == dest {
			return true
		}
	}
	return false
}
