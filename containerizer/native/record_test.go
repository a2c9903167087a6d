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
	"github.com/gpuiso/gpuiso/record"
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
	check := func(rec ctrRecord, version int) {
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
	if err := r.writeRecord(ctrRecord{ID: "c", Pid: 1, Start: 2}); err != nil {
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
		if !errors.Is(err, record.ErrCorrupt) || torn(err) != tc.torn {
			t.Errorf("%s: %v (torn %v)", name, err, torn(err))
		}
		if !tc.torn {
			if out := r.listOne(context.Background(), "c", nil); out.Err == nil || out.Reserved {
				t.Errorf("%s: listed %+v", name, out)
			}
		}
	}
}

// TestLegacySupervisorAndExit: a supervisor record and an exit record of
// version 1 (the holder's JSON, the code alone, checked in as the runtime
// wrote them) read as the supervisor and the exit status they name, so
// that an upgrade neither orphans a running container nor forgets how one
// ended; written again, they are entries of the store with the same
// content.
func TestLegacySupervisorAndExit(t *testing.T) {
	dir := t.TempDir()
	copyRecord(t, dir, "c1")
	for _, name := range []string{supervisorFile, exitFile} {
		b, err := os.ReadFile(filepath.Join("testdata", "records-v1", "c1", name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "c1", name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	r := &runner{cfg: Config{StateDir: dir, ProcRoot: t.TempDir()}}
	check := func(version string) {
		t.Helper()
		sup, err := r.readSupervisor("c1")
		if err != nil || sup != (allocator.Holder{Pid: 4243, Start: 987654322}) {
			t.Errorf("%s supervisor = %+v, %v", version, sup, err)
		}
		ex, err := r.readExit("c1")
		if err != nil || ex.Code != 3 {
			t.Errorf("%s exit = %+v, %v", version, ex, err)
		}
		out := r.listOne(context.Background(), "c1", nil)
		if out.Exit == nil || out.Exit.Code != 3 {
			t.Errorf("%s: listed exit %+v", version, out.Exit)
		}
	}
	check("version 1")
	if err := writeSupervisor(filepath.Join(dir, "c1"), "c1", allocator.Holder{Pid: 4243, Start: 987654322}); err != nil {
		t.Fatal(err)
	}
	cdir, err := os.OpenRoot(filepath.Join(dir, "c1"))
	if err != nil {
		t.Fatal(err)
	}
	defer cdir.Close()
	if err := writeExit(cdir, filepath.Join(dir, "c1", exitFile), exitRecord{Code: 3}); err != nil {
		t.Fatal(err)
	}
	for name, prefix := range map[string]string{
		supervisorFile: `{"format":"gpuiso-native-supervisor","version":2,"key":"c1","phase":"completed","process":{"pid":4243,"start":987654322}`,
		exitFile:       `{"format":"gpuiso-native-exit","version":2,"key":"c1","phase":"completed","data":{"code":3}`,
	} {
		if b, _ := os.ReadFile(filepath.Join(dir, "c1", name)); !strings.HasPrefix(string(b), prefix) {
			t.Errorf("%s written as %s", name, b)
		}
	}
	check("version 2")
}

// TestSupervisorUnknown: a supervisor the proc file system could not tell
// (the zero holder) is recorded and read back as such; an exit record of
// another container is not this one's.
func TestSupervisorUnknown(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "c2"), 0o700); err != nil {
		t.Fatal(err)
	}
	r := &runner{cfg: Config{StateDir: dir, ProcRoot: t.TempDir()}}
	if err := writeSupervisor(filepath.Join(dir, "c2"), "c2", allocator.Holder{}); err != nil {
		t.Fatal(err)
	}
	if sup, err := r.readSupervisor("c2"); err != nil || sup != (allocator.Holder{}) {
		t.Errorf("supervisor = %+v, %v", sup, err)
	}
	other, err := os.OpenRoot(filepath.Join(dir, "c2"))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := writeExit(other, filepath.Join(dir, "c3", exitFile), exitRecord{Code: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.readExit("c2"); !errors.Is(err, record.ErrCorrupt) {
		t.Errorf("exit of another container read as %v", err)
	}
}
