package nvmlnode_test

import (
	"context"
	"errors"
	"testing"

	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
)

// TestMIGManager makes MIG devices through NVML's calls on a simulated
// H100 with MIG enabled and no instance: at the placement asked for (the
// device as discovery reads it), at the first free one, refused where an
// instance is in the way or the profile has no such placement, and
// destroyed again; the user's instance of GPU 1 and GPUs with MIG off are
// never changed.
func TestMIGManager(t *testing.T) {
	ctx := context.Background()
	sim, err := simnode.New("hgx-h100-dynmig")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	m, err := nvmlnode.NewMIGManager(nvmlnode.WithNVML(sim.NVML()), nvmlnode.WithDevRoot(dir), nvmlnode.WithProcRoot(dir))
	if err != nil {
		t.Fatal(err)
	}
	d, err := m.CreateMIGAt(ctx, sim.UUID(0), "2g.20gb", 2)
	if err != nil {
		t.Fatal(err)
	}
	made := sim.MIGDevices(0)
	if len(made) != 1 || made[0].UUID != d.UUID || made[0].Start != 2 || made[0].Profile != "2g.20gb" {
		t.Fatalf("GPU 0 holds %+v", made)
	}
	if d.Placement != (node.MIGPlacement{Start: 2, Size: 2}) || d.Profile != "2g.20gb" || d.GI != made[0].GI || d.CI != 0 || d.ParentUUID != sim.UUID(0) || d.SMs != 32 {
		t.Fatalf("made %+v", d)
	}
	for _, tt := range []struct {
		name    string
		gpu     int
		profile string
		start   int
		want    error
	}{
		{"over the 2g.20gb", 0, "1g.10gb", 3, node.ErrInsufficient},
		{"not a placement", 0, "4g.40gb", 4, node.ErrInvalid},
		{"no such profile", 0, "9g.1tb", 0, node.ErrInvalid},
		{"inside the user's 3g.40gb", 1, "1g.10gb", 1, node.ErrInsufficient},
		{"MIG off", 2, "1g.10gb", 0, node.ErrNotSupported},
	} {
		if _, err := m.CreateMIGAt(ctx, sim.UUID(tt.gpu), tt.profile, tt.start); !errors.Is(err, tt.want) {
			t.Errorf("%s: %v, want %v", tt.name, err, tt.want)
		}
	}
	first, err := m.CreateMIG(ctx, sim.UUID(0), "1g.10gb")
	if err != nil {
		t.Fatal(err)
	}
	if first.Placement.Start != 0 || len(sim.MIGDevices(0)) != 2 {
		t.Fatalf("the first free 1g.10gb: %+v", first)
	}
	for _, u := range []string{d.UUID, first.UUID} {
		if err := m.DestroyMIG(ctx, sim.UUID(0), u); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(sim.MIGDevices(0)); n != 0 {
		t.Fatalf("GPU 0 holds %d after the destroys", n)
	}
	if err := m.DestroyMIG(ctx, sim.UUID(0), d.UUID); !errors.Is(err, node.ErrNotFound) {
		t.Fatalf("a second destroy: %v", err)
	}
	if got := sim.MIGDevices(1); len(got) != 1 || got[0].Profile != "3g.40gb" {
		t.Fatalf("GPU 1: %+v", got)
	}
}
