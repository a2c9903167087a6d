package mps

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/gpuiso/gpuiso/internal/linux"
)

// record is a daemon's record file in its directory.
const (
	recordFile    = "daemon.json"
	recordVersion = 1
	lockFile      = ".lock"
)

type record struct {
	Version int `json:"version"`
	Daemon
}

// read reads owner's record, with Alive set.
func (m *Manager) read(owner string) (Daemon, error) {
	b, err := os.ReadFile(filepath.Join(m.daemonDir(owner), recordFile))
	if err != nil {
		return Daemon{}, err
	}
	var r record
	if err := json.Unmarshal(b, &r); err != nil {
		return Daemon{}, fmt.Errorf("record of %s: %w: %v", owner, ErrDaemon, err)
	}
	if r.Version != recordVersion || r.Owner != owner {
		return Daemon{}, fmt.Errorf("record of %s: version %d, owner %q: %w", owner, r.Version, r.Owner, ErrDaemon)
	}
	d := r.Daemon
	want := m.blank(owner)
	d.Dir, d.PipeDir, d.LogDir, d.ShmDir = want.Dir, want.PipeDir, want.LogDir, want.ShmDir
	d.Alive = d.Pid > 0 && linux.Process{Pid: d.Pid, Start: d.Start}.Alive(m.procRoot)
	return d, nil
}

// write replaces d's record atomically.
func (m *Manager) write(d Daemon) error {
	b, err := json.Marshal(record{Version: recordVersion, Daemon: d})
	if err != nil {
		return err
	}
	return linux.ReplaceFile(filepath.Join(d.Dir, recordFile), b, 0o600)
}
