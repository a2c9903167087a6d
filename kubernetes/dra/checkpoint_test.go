package dra_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/kubernetes/dra"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/record"
)

const gibibyte = 1 << 30

// TestCheckpointFormat: a checkpoint is a record store entry of format
// gpuiso-dra-claim, version 3, keyed by the claim's uid, its state the
// entry's phase; it reads back as written, share included, and the
// checked-in files of that version read as they say.
func TestCheckpointFormat(t *testing.T) {
	dir := t.TempDir()
	cp := dra.Checkpoint{UID: "v", Namespace: "ns", Name: "c", State: dra.StatePrepareStarted, Owner: "claim-v",
		Devices: []dra.PreparedDevice{{Device: "share-0", UUID: "GPU-x", ShareID: "id"}}, Share: &dra.PreparedShare{MemoryBytes: gibibyte}}
	if err := dra.WriteCheckpoint(dir, cp); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "v.json"))
	if err != nil {
		t.Fatal(err)
	}
	var w struct {
		Format  string          `json:"format"`
		Version int             `json:"version"`
		Key     string          `json:"key"`
		Phase   string          `json:"phase"`
		Data    json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(b, &w); err != nil || w.Format != "gpuiso-dra-claim" || w.Version != 3 || w.Key != "v" || w.Phase != string(record.Started) || len(w.Data) == 0 {
		t.Fatalf("file %s: %+v, %v", b, w, err)
	}
	got, err := dra.ParseCheckpoint(b)
	if err != nil || got.UID != "v" || got.State != dra.StatePrepareStarted || got.Owner != "claim-v" || got.Namespace != "ns" ||
		got.Share == nil || got.Share.MemoryBytes != gibibyte || got.Devices[0].ShareID != "id" {
		t.Fatalf("parse = %+v, %v", got, err)
	}
	if _, err := dra.ParseCheckpoint([]byte(strings.Replace(string(b), `"ns"`, `"other"`, 1))); err == nil {
		t.Error("an edited checkpoint parsed")
	}
	// A share of two devices is refused, whatever its checksum says.
	bad := cp
	bad.Devices = append(bad.Devices, dra.PreparedDevice{Device: "gpu-1"})
	if err := dra.WriteCheckpoint(dir, bad); err != nil {
		t.Fatal(err)
	}
	b, _ = os.ReadFile(filepath.Join(dir, "v.json"))
	if _, err := dra.ParseCheckpoint(b); err == nil {
		t.Error("a share of two devices parsed")
	}
	files, _ := filepath.Glob(filepath.Join("testdata", "checkpoints-v3", "*.json"))
	if len(files) == 0 {
		t.Fatal("no checked-in version 3 checkpoints")
	}
	for _, p := range files {
		b, _ := os.ReadFile(p)
		if c, err := dra.ParseCheckpoint(b); err != nil || c.UID+".json" != filepath.Base(p) {
			t.Errorf("%s: %+v, %v", p, c, err)
		}
	}
}

// TestLegacyCheckpoints: the files of versions 1 and 2 (their own shape,
// before the record store: checked in as the driver wrote them) read as
// the claims they record, so that an upgrade keeps every prepared claim;
// the next write is of version 3. Version 1 with a share and version 2
// without one stay corrupt.
func TestLegacyCheckpoints(t *testing.T) {
	src := filepath.Join("testdata", "checkpoints-v2")
	dir := t.TempDir()
	files, _ := filepath.Glob(filepath.Join(src, "*.json"))
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(p)), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]string{
		"0f6c1f3e-8d1e-4a55-9a8e-1d2b3c4d5e6f": "PrepareCompleted 2 devices",
		"7a7a7a7a-0000-4000-8000-000000000001": "PrepareCompleted 1 devices share 4294967296 50%",
		"c0c0c0c0-0000-4000-8000-000000000003": "PrepareStarted 1 devices",
	}
	for uid, w := range want {
		b, err := os.ReadFile(filepath.Join(dir, uid+".json"))
		if err != nil {
			t.Fatal(err)
		}
		c, err := dra.ParseCheckpoint(b)
		if err != nil {
			t.Fatalf("%s: %v", uid, err)
		}
		got := c.State + " " + strconv.Itoa(len(c.Devices)) + " devices"
		if c.Share != nil {
			got += " share " + strconv.Itoa(int(c.Share.MemoryBytes)) + " " + strconv.Itoa(c.Share.ComputePercent) + "%"
		}
		if got != w || c.UID != uid || c.Owner != "claim-"+uid || c.Devices[0].UUID == "" {
			t.Errorf("%s: %q (%+v), want %q", uid, got, c, w)
		}
		if c.State == dra.StatePrepareCompleted && len(c.Devices[0].CDIDeviceIDs) != 1 {
			t.Errorf("%s: CDI devices %v", uid, c.Devices[0].CDIDeviceIDs)
		}
		// Written again: in the record store's format, the same claim.
		if err := dra.WriteCheckpoint(dir, c); err != nil {
			t.Fatal(err)
		}
		b, _ = os.ReadFile(filepath.Join(dir, uid+".json"))
		if !strings.Contains(string(b), `"version":3`) {
			t.Errorf("%s rewritten as %s", uid, b)
		}
		if c2, err := dra.ParseCheckpoint(b); err != nil || c2.State != c.State || len(c2.Devices) != len(c.Devices) || (c.Share != nil) != (c2.Share != nil) {
			t.Errorf("%s rewritten: %+v, %v", uid, c2, err)
		}
	}

	// The version rule is checked before the checksum: its message says
	// which refused the file.
	resum := func(m map[string]any) []byte {
		b, _ := json.Marshal(m)
		return b
	}
	share, _ := os.ReadFile(filepath.Join(src, "7a7a7a7a-0000-4000-8000-000000000001.json"))
	var m map[string]any
	if err := json.Unmarshal(share, &m); err != nil {
		t.Fatal(err)
	}
	m["version"] = 1
	if _, err := dra.ParseCheckpoint(resum(m)); err == nil || !strings.Contains(err.Error(), "version 1 with share") {
		t.Errorf("version 1 with a share: %v", err)
	}
	if _, err := dra.ParseCheckpoint([]byte(strings.Replace(string(share), `"ml"`, `"other"`, 1))); err == nil || !strings.Contains(err.Error(), "checksum") {
		t.Errorf("an edited version 2 checkpoint: %v", err)
	}
}

// TestCorruptCheckpointKinds: a checkpoint that cannot be trusted is a
// *CheckpointError matching ErrCorruptCheckpoint, node.ErrCorrupt and the
// record store's ErrCorrupt; Prepare refuses its claim and leaves the
// file for a person to look at.
func TestCorruptCheckpointKinds(t *testing.T) {
	dir := t.TempDir()
	if err := dra.WriteCheckpoint(dir, dra.Checkpoint{UID: "u", State: dra.StatePrepareCompleted, Owner: "claim-u"}); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "u.json")
	b, _ := os.ReadFile(p)
	if err := os.WriteFile(p, b[:len(b)/2], 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := dra.ReadCheckpoint(dir, "u")
	var ce *dra.CheckpointError
	if !errors.As(err, &ce) || ce.Path != p || !errors.Is(err, dra.ErrCorruptCheckpoint) || !errors.Is(err, node.ErrCorrupt) || !errors.Is(err, record.ErrCorrupt) {
		t.Fatalf("read = %v", err)
	}
	// Another claim's file under this uid, and an owner not the claim's.
	for name, c := range map[string]dra.Checkpoint{
		"owner": {UID: "u", State: dra.StatePrepareCompleted, Owner: "victim"},
	} {
		if err := dra.WriteCheckpoint(dir, c); err != nil {
			t.Fatal(err)
		}
		if _, err := dra.ReadCheckpoint(dir, "u"); !errors.Is(err, dra.ErrCorruptCheckpoint) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if err := dra.WriteCheckpoint(dir, dra.Checkpoint{UID: "w", State: dra.StatePrepareCompleted, Owner: "claim-w"}); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "w.json"), p); err != nil {
		t.Fatal(err)
	}
	if _, err := dra.ReadCheckpoint(dir, "u"); !errors.Is(err, dra.ErrCorruptCheckpoint) {
		t.Errorf("another claim's file: %v", err)
	}
	if err := dra.WriteCheckpoint(dir, dra.Checkpoint{UID: "../x", State: dra.StatePrepareStarted}); !errors.Is(err, dra.ErrInvalidConfig) {
		t.Errorf("uid ../x: %v", err)
	}
}
