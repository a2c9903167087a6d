package native

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/node"
	rstore "github.com/gpuiso/gpuiso/record"
)

// copyRecord puts testdata's record of id in dir/id.
func copyRecord(t *testing.T, dir, id string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "records-v1", id, recordFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, id), 0o700); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, id, recordFile)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestLegacyRecord: a record of version 1 (the runtime's own shape before
// the record store, checked in as it wrote it) reads as the container it
// records, its init included, so that an upgrade loses no running
// container; written again it is an entry of the store with the same
// content.
func TestLegacyRecord(t *testing.T) {
	dir := t.TempDir()
	p := copyRecord(t, dir, "c1")
	r := &runner{cfg: Config{StateDir: dir, ProcRoot: t.TempDir()}}
	rec, err := r.readRecord("c1")
	if err != nil {
		t.Fatal(err)
	}
	check := func(rec record, version int) {
		t.Helper()
		if rec.ID != "c1" || rec.Version != version || rec.Pid != 4242 || rec.Start != 987654321 || len(rec.GPUs) != 2 ||
			rec.GPUs[1].UUID != "GPU-66666666-2222-3333-4444-555555555555" || len(rec.Mounts) != 1 || len(rec.Env) != 1 ||
			rec.CPUAffinity != containerizer.CPUAffinityNUMA || rec.Share == nil || rec.Share.Mode != allocator.ShareMemory ||
			rec.Volume != "/var/lib/gpuiso/volumes/580.159.04" || rec.VolumeVersion != "580.159.04" {
			t.Errorf("record %+v", rec)
		}
	}
	check(rec, 1)
	// As List shows it: a container whose init is gone.
	out := r.listOne(context.Background(), "c1", nil)
	if out.Err != nil || out.Reserved || out.Pid != 4242 || len(out.GPUs) != 2 || out.Exit == nil {
		t.Errorf("listed %+v", out)
	}
	if err := r.writeRecord(rec); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	if !strings.HasPrefix(string(b), `{"format":"gpuiso-native-container","version":2,"key":"c1","phase":"completed","process":{"pid":4242,"start":987654321}`) {
		t.Errorf("written as %s", b)
	}
	rec, err = r.readRecord("c1")
	if err != nil {
		t.Fatal(err)
	}
	check(rec, 2)
}

// TestRecordErrors: no record matches fs.ErrNotExist (a reservation);
// one a crash cut short is torn (List then asks the cgroup); one of a
// newer version, or another container's, is corrupt but not torn.
func TestRecordErrors(t *testing.T) {
	dir := t.TempDir()
	r := &runner{cfg: Config{StateDir: dir, ProcRoot: t.TempDir()}}
	if err := os.Mkdir(filepath.Join(dir, "c"), 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := r.readRecord("c"); !errors.Is(err, os.ErrNotExist) || !errors.Is(err, node.ErrNotFound) {
		t.Fatalf("no record: %v", err)
	}
	if err := r.writeRecord(record{ID: "c", Pid: 1, Start: 2}); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "c", recordFile)
	good, _ := os.ReadFile(p)
	for name, tc := range map[string]struct {
		b    []byte
		torn bool
	}{
		"empty":         {nil, true},
		"cut short":     {good[:len(good)/2], true},
		"newer version": {[]byte(strings.Replace(string(good), `"version":2`, `"version":3`, 1)), false},
		"another's":     {[]byte(strings.Replace(string(good), `"key":"c"`, `"key":"d"`, 1)), false},
	} {
		if err := os.WriteFile(p, tc.b, 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := r.readRecord("c")
		if !errors.Is(err, rstore.ErrCorrupt) || torn(err) != tc.torn {
			t.Errorf("%s: %v (torn %v)", name, err, torn(err))
		}
		if !tc.torn {
			if out := r.listOne(context.Background(), "c", nil); out.Err == nil || out.Reserved {
				t.Errorf("%s: listed %+v", name, out)
			}
		}
	}
}
