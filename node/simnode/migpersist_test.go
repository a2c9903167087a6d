package simnode_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/node/simnode"
)

// TestRestoreMIGLegacy: a layout record of version 1 (the layouts' JSON
// alone, checked in as a MIGManager wrote it) restores the layout it
// names; the next change writes the record in the store's format, which
// restores the same.
func TestRestoreMIGLegacy(t *testing.T) {
	testenv.RequireRoot(t)
	sim, _ := simnode.New("hgx-h100-dynmig")
	h, err := sim.MakeHost(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer h.Remove()
	old, err := os.ReadFile(filepath.Join("testdata", "mig-layout-v1.json"))
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(h.ProcRoot, "driver", "nvidia", "gpuiso-sim-mig-layout.json")
	if err := os.WriteFile(p, old, 0o644); err != nil {
		t.Fatal(err)
	}
	restore := func() *simnode.Node {
		t.Helper()
		s, _ := simnode.New("hgx-h100-dynmig")
		if err := s.RestoreMIG(h); err != nil {
			t.Fatal(err)
		}
		if got := s.MIGDevices(0); len(got) < 1 || got[0].Profile != "2g.20gb" || got[0].Start != 4 || len(s.MIGDevices(1)) != 1 {
			t.Fatalf("restored %+v, %+v", got, s.MIGDevices(1))
		}
		return s
	}
	s := restore()
	if _, err := s.MIGManager(h).CreateMIGAt(context.Background(), s.UUID(0), "1g.10gb", 6); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil || !strings.HasPrefix(string(b), `{"format":"gpuiso-sim-mig-layout","version":2,`) {
		t.Fatalf("written as %s (%v)", b, err)
	}
	if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("record %v, %v; want mode 0644", fi, err)
	}
	if got := restore().MIGDevices(0); len(got) != 2 {
		t.Fatalf("restored from version 2: %+v", got)
	}
}
