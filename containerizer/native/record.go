package native

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/node"
	rstore "github.com/gpuiso/gpuiso/record"
)

// record is what survives a restart of the containerizer: one per container,
// in <state dir>/<id>/container.json, an entry of the state directory's
// record store (package containerizer/record) of format
// "gpuiso-native-container", version 2: the id is its key, the init
// process its process. Version 1, the runtime's own shape before the
// store, is read still.
type record struct {
	// Version is the version the record was read in.
	Version int              `json:"-"`
	ID      string           `json:"-"`
	GPUs    []node.DeviceRef `json:"gpus"`
	// Mounts and Env are what the container got beside its GPUs (the driver
	// volume, the command's environment): what a plan is rebuilt from.
	Mounts []specs.Mount `json:"mounts,omitempty"`
	Env    []string      `json:"env,omitempty"`
	// CPUAffinity is the spec's: a plan made again (after a restart, for
	// other GPUs) pins the container as the first did.
	CPUAffinity containerizer.CPUAffinity `json:"cpuAffinity,omitempty"`
	// Share is the share of its one GPU the container holds, or nil.
	Share *allocator.Share `json:"share,omitempty"`
	// Volume and VolumeVersion name the driver volume the container uses.
	Volume        string `json:"volume,omitempty"`
	VolumeVersion string `json:"volumeVersion,omitempty"`
	// Pid and Start identify the init process: its pid and its start time
	// (clock ticks since boot), which guards against pid reuse; the
	// record's process.
	Pid   int    `json:"-"`
	Start uint64 `json:"-"`
}

const (
	recordFormat  = "gpuiso-native-container"
	recordVersion = 2
	recordFile    = "container.json"
)

// records is the record store of the state directory. Records are not
// synced to disk: they describe processes, which no machine crash
// outlives, and the recoveries treat a record a crash left unreadable as
// a container that is gone (once its cgroup holds no process).
func (r *runner) records() *rstore.Store[record] {
	s, _ := rstore.New(r.cfg.StateDir, rstore.Options[record]{Format: recordFormat, Version: recordVersion, Name: recordFile, Legacy: legacyRecord, NoSync: true}) // valid options
	return s
}

// writeRecord replaces rec's record, atomically against this process's
// death.
func (r *runner) writeRecord(rec record) error {
	e := rstore.Entry[record]{Key: rec.ID, Phase: rstore.Completed, Data: rec}
	if rec.Pid > 0 {
		e.Process = &node.Process{Pid: rec.Pid, Start: rec.Start}
	}
	return r.records().Write(e)
}

// readRecord reads container id's record: an error matching
// fs.ErrNotExist when it has none, a *record.CorruptError when it cannot
// be trusted.
func (r *runner) readRecord(id string) (record, error) {
	e, err := r.records().Read(id)
	if errors.Is(err, rstore.ErrNoRecord) {
		return record{}, fmt.Errorf("%w: %w", err, fs.ErrNotExist)
	}
	if err != nil {
		return record{}, err
	}
	rec := e.Data
	rec.ID, rec.Version = e.Key, e.Version
	if e.Process != nil {
		rec.Pid, rec.Start = e.Process.Pid, e.Process.Start
	}
	return rec, nil
}

// torn tells whether err is of a record that does not parse: one a
// machine crash cut short (records are not synced), not one of another
// version or container.
func torn(err error) bool {
	var se *json.SyntaxError
	return errors.As(err, &se)
}

// legacyRecord reads a record of version 1: the fields of record, with
// the version, the id and the init's pid and start time among them.
func legacyRecord(b []byte) (rstore.Entry[record], error) {
	var o struct {
		Version int    `json:"version"`
		ID      string `json:"id"`
		Pid     int    `json:"pid,omitempty"`
		Start   uint64 `json:"start,omitempty"`
		record
	}
	if err := json.Unmarshal(b, &o); err != nil {
		return rstore.Entry[record]{}, err
	}
	if o.Version != 1 {
		return rstore.Entry[record]{}, fmt.Errorf("version %d: not a record this containerizer wrote", o.Version)
	}
	e := rstore.Entry[record]{Key: o.ID, Phase: rstore.Completed, Version: 1, Data: o.record}
	if o.Pid != 0 || o.Start != 0 {
		e.Process = &node.Process{Pid: o.Pid, Start: o.Start}
	}
	return e, nil
}

// exitRecord is written by the init when the command exits.
type exitRecord struct {
	Code int `json:"code"`
}

// writeJSON replaces path with v as JSON, atomically against this
// process's death (linux.ReplaceFile). Records are not synced to disk: they
// describe processes, which no machine crash outlives, and Recover treats a
// record a crash left unreadable as a container that is gone.
func writeJSON(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return linux.ReplaceFile(path, b, 0o600)
}

// writeExit writes v to name in dir as writeJSON does, through a handle on
// the directory opened before the init left the host's root.
func writeExit(dir *os.Root, name string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return linux.ReplaceFileIn(dir, name, b, 0o600)
}

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// startTime reads a process's start time from /proc/<pid>/stat.
func startTime(procRoot string, pid int) (uint64, error) {
	st, err := linux.ReadProcStat(procRoot, pid)
	if err != nil {
		return 0, err
	}
	return st.Start, nil
}

// alive reports whether the process pid is still the one that started at
// start (and has not exited).
func alive(procRoot string, pid int, start uint64) bool {
	return pid > 0 && linux.Process{Pid: pid, Start: start}.Alive(procRoot)
}
