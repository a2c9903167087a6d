package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLegacyRecords: a record and an index entry of version 1 (the
// runtime's own shapes before the record store, checked in as it wrote
// them) read as the claim and the state directory they name, so that an
// upgraded runtime settles what an older one created; written again they
// are entries of the store with the same content.
func TestLegacyRecords(t *testing.T) {
	const owner = "c1.0123456789ab"
	rs := records{dir: filepath.Join(t.TempDir(), recordsDir), index: t.TempDir()}
	for dir, from := range map[string]string{rs.dir: "records-v1", rs.index: "index-v1"} {
		b, err := os.ReadFile(filepath.Join("testdata", from, owner+".json"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, owner+".json"), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	check := func(version int) ctrRecord {
		t.Helper()
		rec, err := rs.read(owner)
		if err != nil || rec.Version != version || rec.Owner != owner || rec.ID != "c1" || rec.Root != "/run/runc" || rec.Runc != "/usr/bin/runc" ||
			rec.Bundle != "/srv/bundles/c1" || rec.Simulate != "dgx1-volta" || rec.Phase != phaseCreated || rec.Init == nil || rec.Init.Pid != 4242 || rec.Init.Start != 987654321 {
			t.Fatalf("version %d: read %+v, %v", version, rec, err)
		}
		return rec
	}
	if got := lookupIndex(rs.index, owner); got != "/var/lib/gpuiso" {
		t.Errorf("index of version 1 = %q", got)
	}
	rec := check(1)
	if err := rs.write(rec); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(rs.path(owner)); !strings.HasPrefix(string(b), `{"format":"gpuiso-runtime-container","version":2,"key":"c1.0123456789ab","phase":"completed","process":{"pid":4242,"start":987654321}`) {
		t.Errorf("written as %s", b)
	}
	check(2)
	if err := rs.writeIndex(owner); err != nil {
		t.Fatal(err)
	}
	if got := lookupIndex(rs.index, owner); got != rs.stateDir() {
		t.Errorf("index = %q, want %q", got, rs.stateDir())
	}
}
