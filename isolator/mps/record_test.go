package mps_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gpuiso/gpuiso/isolator/mps"
	"github.com/gpuiso/gpuiso/record"
)

// daemonIn puts b as owner's daemon record in dir, a manager's directory,
// and returns what Daemons lists of owner.
func daemonIn(t *testing.T, dir, owner string, b []byte) mps.Daemon {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(dir, owner), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, owner, "daemon.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	list, err := mps.Daemons(context.Background(), dir)
	if err != nil || len(list) != 1 || list[0].Owner != owner {
		t.Fatalf("Daemons = %+v, %v; want %s's", list, err, owner)
	}
	return list[0]
}

// TestLegacyRecord: a daemon record of the releases before the record
// store (testdata/daemon-v1.json: version 1, no checksum) is still read,
// whole; its directories are the manager's own, whatever it says.
func TestLegacyRecord(t *testing.T) {
	b, err := os.ReadFile("testdata/daemon-v1.json")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	d := daemonIn(t, dir, "job-1", b)
	want := mps.Daemon{
		Owner: "job-1", GPU: "GPU-5d1a1c8e-0000-0000-0000-000000000000", Index: 0,
		Limits: mps.Limits{MemoryBytes: 4 << 30, ComputePercent: 50}, Pid: 4194000, Start: 123456, Mark: "0a1b2c3d4e5f60718293a4b5",
		Dir: filepath.Join(dir, "job-1"), PipeDir: filepath.Join(dir, "job-1", "pipe"), LogDir: filepath.Join(dir, "job-1", "log"), ShmDir: filepath.Join(dir, "job-1", "shm"),
		Started: time.Date(2026, 11, 1, 8, 0, 0, 0, time.UTC),
	}
	if d != want {
		t.Fatalf("legacy record read as %+v, want %+v", d, want)
	}
	// A legacy record of another owner is not this owner's.
	if d := daemonIn(t, t.TempDir(), "job-2", b); d.GPU != "" || d.Mark != "" {
		t.Fatalf("job-1's legacy record read as job-2's: %+v", d)
	}
}

// TestRecordChecked: a daemon record is an entry of the record store,
// checksummed: one the store wrote is read, and the same with a byte
// changed is not trusted (the daemon is listed with its directory alone,
// for a sweep to stop), where the unchecked records of earlier releases
// were read as they stood.
func TestRecordChecked(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "job-1"), 0o700); err != nil {
		t.Fatal(err)
	}
	store, err := record.New(dir, record.Options[mps.Daemon]{Format: "gpuiso-mps-daemon", Version: 2, Name: "daemon.json"})
	if err != nil {
		t.Fatal(err)
	}
	d := mps.Daemon{Owner: "job-1", GPU: "GPU-5d1a1c8e-0000-0000-0000-000000000000", Limits: mps.Limits{MemoryBytes: 4 << 30}, Mark: "m"}
	if err := store.Write(record.Entry[mps.Daemon]{Key: "job-1", Phase: record.Started, Data: d}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "job-1", "daemon.json"))
	if err != nil {
		t.Fatal(err)
	}
	if got := daemonIn(t, dir, "job-1", b); got.GPU != d.GPU || got.Limits != d.Limits || got.Mark != d.Mark {
		t.Fatalf("record read as %+v", got)
	}
	tampered := bytes.Replace(b, []byte("4294967296"), []byte("8589934592"), 1)
	if bytes.Equal(tampered, b) {
		t.Fatal("the record does not hold its memory limit")
	}
	if got := daemonIn(t, dir, "job-1", tampered); got.GPU != "" || got.Limits != (mps.Limits{}) || got.Dir != filepath.Join(dir, "job-1") {
		t.Fatalf("tampered record read as %+v", got)
	}
}
