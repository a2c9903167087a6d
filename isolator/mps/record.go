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

// records is the store of the manager's daemon records.
func (m *Manager) records() (*record.Store[Daemon], error) {
	return record.New(m.dir, record.Options[Daemon]{Format: recordFormat, Version: recordVersion, Name: recordFile, Legacy: legacyRecord, NoSync: true})
}

// legacyRecord reads a record of the releases before the store: the
// daemon's fields beside "version": 1, with no checksum.
func legacyRecord(b []byte) (record.Entry[Daemon], error) {
	var r struct {
		Version int `json:"version"`
		Daemon
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return record.Entry[Daemon]{}, err
	}
	if r.Version != 1 {
		return record.Entry[Daemon]{}, fmt.Errorf("version %d of a daemon record before the store, want 1", r.Version)
	}
	return entry(r.Daemon, 1), nil
}

// entry is d's record: Started until it names its process.
func entry(d Daemon, version int) record.Entry[Daemon] {
	e := record.Entry[Daemon]{Key: d.Owner, Phase: record.Started, Version: version, Data: d}
	if p := (node.Process{Pid: d.Pid, Start: d.Start}); p.Valid() {
		e.Phase, e.Process = record.Completed, &p
	}
	return e
}

// read reads owner's record, with Alive set. A missing one matches
// fs.ErrNotExist (isNotExist); one that cannot be trusted is ErrDaemon.
func (m *Manager) read(owner string) (Daemon, error) {
	rs, err := m.records()
	if err != nil {
		return Daemon{}, err
	}
	e, err := rs.Read(owner)
	if errors.Is(err, record.ErrNoRecord) {
		return Daemon{}, fmt.Errorf("record of %s: %w", owner, err)
	}
	if err != nil {
		return Daemon{}, fmt.Errorf("record of %s: %w: %v", owner, ErrDaemon, err)
	}
	d := e.Data
	if d.Owner != owner {
		return Daemon{}, fmt.Errorf("record of %s: owner %q: %w", owner, d.Owner, ErrDaemon)
	}
	want := m.blank(owner)
	d.Dir, d.PipeDir, d.LogDir, d.ShmDir = want.Dir, want.PipeDir, want.LogDir, want.ShmDir
	d.Alive = d.Pid > 0 && linux.Alive(m.procRoot, linux.Process{Pid: d.Pid, Start: d.Start})
	return d, nil
}

// write replaces d's record atomically.
func (m *Manager) write(d Daemon) error {
	rs, err := m.records()
	if err != nil {
		return err
	}
	return rs.Write(entry(d, recordVersion))
}
