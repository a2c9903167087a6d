package chain

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/record"
)

// TestLegacyRecords: the records of version 1 (the isolator's own shape
// before the record store, checked in as it wrote them) read as the
// containers they record.
func TestLegacyRecords(t *testing.T) {
	s := records(filepath.Join("testdata", "records-v1"))
	want := map[string]string{
		"job-1": "completed 2 volume 580.159.04 cgroup agent/job-1",
		"job-2": "completed 1 share memory",
		"job-3": "started 0",
	}
	keys, err := s.List()
	if err != nil || !slices.Equal(keys, []string{"job-1", "job-2", "job-3"}) {
		t.Fatalf("List = %v, %v", keys, err)
	}
	for id, w := range want {
		i := &Isolator{recs: s}
		r, err := i.read(id)
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		got := string(r.Phase) + " " + string(rune('0'+len(r.GPUs)))
		if r.Volume != "" {
			got += " volume " + r.Volume
		}
		if r.Cgroup != "" {
			got += " cgroup " + r.Cgroup
		}
		if r.Share != nil {
			got += " share " + string(r.Share.Mode)
		}
		if got != w || r.ID != id {
			t.Errorf("%s: %q (%+v), want %q", id, got, r, w)
		}
	}
}

// TestRecoverLegacy: a container an agent of the version before prepared
// (its record of version 1) is recovered after the upgrade: its GPUs held
// again, its rules enforced; its record's next write is of the store's
// format.
func TestRecoverLegacy(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	gpus := []string{f.inv.Devices[0].UUID, f.inv.Devices[1].UUID}
	old, _ := json.Marshal(map[string]any{"version": 1, "id": "old", "phase": "prepared", "gpus": gpus})
	if err := os.WriteFile(filepath.Join(f.dir, "old.json"), old, 0o600); err != nil {
		t.Fatal(err)
	}
	iso, a := f.open(t)
	res, err := iso.Recover(ctx, []string{"old"})
	if err != nil || !slices.Equal(res.Recovered, []string{"old"}) {
		t.Fatalf("Recover = %+v, %v", res, err)
	}
	al, err := a.Allocation("old")
	if err != nil || !slices.Equal(uuids(al.Devices), gpus) {
		t.Fatalf("old holds %v, %v", al.Devices, err)
	}
	for _, g := range al.Devices {
		if !f.dev.allows(parent+"/old", g) {
			t.Errorf("GPU %d not allowed again", g.Index)
		}
	}
	if _, err := iso.Update(ctx, "old", 1); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(filepath.Join(f.dir, "old.json"))
	if !strings.Contains(string(b), `"format":"gpuiso-chain-container","version":2`) {
		t.Errorf("rewritten as %s", b)
	}
}

// TestCorruptRecord: a record that cannot be trusted is ErrCorruptRecord,
// of the kind node.ErrCorrupt, and the store's ErrCorrupt.
func TestCorruptRecord(t *testing.T) {
	f := newFixture(t)
	iso, _ := f.open(t)
	if err := iso.write(held{ID: "c", Phase: phasePrepared, GPUs: []string{"GPU-x"}}); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(f.dir, "c.json")
	b, _ := os.ReadFile(p)
	if err := os.WriteFile(p, []byte(strings.Replace(string(b), "GPU-x", "GPU-y", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := iso.read("c")
	if !errors.Is(err, ErrCorruptRecord) || !errors.Is(err, node.ErrCorrupt) || !errors.Is(err, record.ErrCorrupt) {
		t.Fatalf("read = %v", err)
	}
	if _, err := iso.Prepare(context.Background(), "c", allocator.Request{}, containerizer.Image{}); !errors.Is(err, ErrCorruptRecord) {
		t.Errorf("Prepare over a corrupt record: %v", err)
	}
}
