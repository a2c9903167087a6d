package mps

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/record"
)

// A daemon's record is an entry of the record store, in its own directory
// of the manager's: "<dir>/<owner>/daemon.json", of format recordFormat,
// checksummed. It is written twice as the daemon starts: Started before
// the process (a crash leaves the directory found), then Completed with
// the process. It describes a running process, which no machine crash
// outlives: its writes are not synced, as they were not before the store.
const (
	recordFile    = "daemon.json"
	recordFormat  = "gpuiso-mps-daemon"
	recordVersion = 2
	lockFile      = ".lock"
)

// stored is what a daemon's record holds: the daemon and, for the daemon
// of a GPU's concurrent slices, the owners of the slices it serves (its
// tenants), sorted. In the record the daemon's fields and "tenants" are
// side by side, so a record of a share's own daemon is as it was.
type stored struct {
	Daemon
	Tenants []string `json:"tenants,omitempty"`
}

// records is the store of the manager's daemon records.
func (m *Manager) records() (*record.Store[stored], error) {
	return record.New(m.dir, record.Options[stored]{Format: recordFormat, Version: recordVersion, Name: recordFile, Legacy: legacyRecord, NoSync: true})
}

// legacyRecord reads a record of the releases before the store: the
// daemon's fields beside "version": 1, with no checksum.
func legacyRecord(b []byte) (record.Entry[stored], error) {
	var r struct {
		Version int `json:"version"`
		Daemon
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return record.Entry[stored]{}, err
	}
	if r.Version != 1 {
		return record.Entry[stored]{}, fmt.Errorf("version %d of a daemon record before the store, want 1", r.Version)
	}
	return entry(stored{Daemon: r.Daemon}, 1), nil
}

// entry is r's record: Started until it names its process.
func entry(r stored, version int) record.Entry[stored] {
	d := r.Daemon
	e := record.Entry[stored]{Key: d.Owner, Phase: record.Started, Version: version, Data: r}
	if p := (node.Process{Pid: d.Pid, Start: d.Start}); p.Valid() {
		e.Phase, e.Process = record.Completed, &p
	}
	return e
}

// read reads owner's record, with Alive set. A missing one matches
// fs.ErrNotExist (isNotExist); one that cannot be trusted is ErrDaemon.
func (m *Manager) read(owner string) (Daemon, error) {
	r, err := m.readRecord(owner)
	return r.Daemon, err
}

// readRecord reads owner's record as read does, with its tenants.
func (m *Manager) readRecord(owner string) (stored, error) {
	rs, err := m.records()
	if err != nil {
		return stored{}, err
	}
	e, err := rs.Read(owner)
	if errors.Is(err, record.ErrNoRecord) {
		return stored{}, fmt.Errorf("record of %s: %w", owner, err)
	}
	if err != nil {
		return stored{}, fmt.Errorf("record of %s: %w: %v", owner, ErrDaemon, err)
	}
	r := e.Data
	d := &r.Daemon
	if d.Owner != owner {
		return stored{}, fmt.Errorf("record of %s: owner %q: %w", owner, d.Owner, ErrDaemon)
	}
	want := m.blank(owner)
	d.Dir, d.PipeDir, d.LogDir, d.ShmDir = want.Dir, want.PipeDir, want.LogDir, want.ShmDir
	d.Alive = d.Pid > 0 && linux.Alive(m.procRoot, linux.Process{Pid: d.Pid, Start: d.Start})
	return r, nil
}

// write replaces d's record atomically, with tenants (those of a slice
// daemon; nil for a share's own).
func (m *Manager) write(d Daemon, tenants []string) error {
	rs, err := m.records()
	if err != nil {
		return err
	}
	return rs.Write(entry(stored{Daemon: d, Tenants: tenants}, recordVersion))
}
