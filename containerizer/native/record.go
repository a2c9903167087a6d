package native

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/record"
)

// record is what survives a restart of the containerizer: one per container,
// in <state dir>/<id>/container.json, an entry of the state directory's
// record store (package record) of format
// "gpuiso-native-container", version 2: the id is its key, the init
// process its process. Version 1, the runtime's own shape before the
// store, is read still.
type ctrRecord struct {
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
func (r *runner) records() *record.Store[ctrRecord] {
	s, _ := record.New(r.cfg.StateDir, record.Options[ctrRecord]{Format: recordFormat, Version: recordVersion, Name: recordFile, Legacy: legacyRecord, NoSync: true}) // valid options
	return s
}

// writeRecord replaces rec's record, atomically against this process's
// death.
func (r *runner) writeRecord(rec ctrRecord) error {
	e := record.Entry[ctrRecord]{Key: rec.ID, Phase: record.Completed, Data: rec}
	if rec.Pid > 0 {
		e.Process = &node.Process{Pid: rec.Pid, Start: rec.Start}
	}
	return r.records().Write(e)
}

// readRecord reads container id's record: an error matching
// fs.ErrNotExist when it has none, a *record.CorruptError when it cannot
// be trusted.
func (r *runner) readRecord(id string) (ctrRecord, error) {
	e, err := r.records().Read(id)
	if errors.Is(err, record.ErrNoRecord) {
		return ctrRecord{}, fmt.Errorf("%w: %w", err, fs.ErrNotExist)
	}
	if err != nil {
		return ctrRecord{}, err
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
func legacyRecord(b []byte) (record.Entry[ctrRecord], error) {
	var o struct {
		Version int    `json:"version"`
		ID      string `json:"id"`
		Pid     int    `json:"pid,omitempty"`
		Start   uint64 `json:"start,omitempty"`
		ctrRecord
	}
	if err := json.Unmarshal(b, &o); err != nil {
		return record.Entry[ctrRecord]{}, err
	}
	if o.Version != 1 {
		return record.Entry[ctrRecord]{}, fmt.Errorf("version %d: not a record this containerizer wrote", o.Version)
	}
	e := record.Entry[ctrRecord]{Key: o.ID, Phase: record.Completed, Version: 1, Data: o.ctrRecord}
	if o.Pid != 0 || o.Start != 0 {
		e.Process = &node.Process{Pid: o.Pid, Start: o.Start}
	}
	return e, nil
}

// exitRecord is written by the init when the command exits: in
// <state dir>/<id>/exit.json, an entry of format "gpuiso-native-exit",
// version 2, keyed by the container's id. Version 1, {"code":N}, is read
// still.
type exitRecord struct {
	Code int `json:"code"`
}

const (
	exitFormat  = "gpuiso-native-exit"
	exitVersion = 2
	exitFile    = "exit.json"
)

// exitOptions are the options of the exit records: name is the file in
// each container's directory, or "" for one file alone. They are not
// synced to disk: they describe processes, which no machine crash
// outlives.
func exitOptions(name string) record.Options[exitRecord] {
	return record.Options[exitRecord]{Format: exitFormat, Version: exitVersion, Name: name, Legacy: legacyExit, NoSync: true}
}

// legacyExit reads an exit record of version 1: the code alone.
func legacyExit(b []byte) (record.Entry[exitRecord], error) {
	var ex exitRecord
	if err := json.Unmarshal(b, &ex); err != nil {
		return record.Entry[exitRecord]{}, err
	}
	return record.Entry[exitRecord]{Phase: record.Completed, Version: 1, Data: ex}, nil
}

// readExit reads the exit status container id's init recorded.
func (r *runner) readExit(id string) (exitRecord, error) {
	s, err := record.New(r.cfg.StateDir, exitOptions(exitFile))
	if err != nil {
		return exitRecord{}, err
	}
	e, err := s.Read(id)
	if err != nil {
		return exitRecord{}, err
	}
	return e.Data, nil
}

// writeExit records the init's exit status at path (the container's
// exit.json), through dir, a handle on the container's directory opened
// before the init left the host's root. The container's id is the
// directory's name.
func writeExit(dir *os.Root, path string, ex exitRecord) error {
	f, err := record.NewFile(path, filepath.Base(filepath.Dir(path)), exitOptions(""))
	if err != nil {
		return err
	}
	return f.WriteIn(dir, record.Entry[exitRecord]{Phase: record.Completed, Data: ex})
}

// supervisorFormat is the format of the supervisor records, in
// <state dir>/<id>/supervisor.json, keyed by the container's id; the
// supervisor is the entry's process. Version 1, the holder's JSON alone,
// is read still.
const (
	supervisorFormat  = "gpuiso-native-supervisor"
	supervisorVersion = 2
)

// supervisorOptions are the options of the supervisor records: name is
// the file in each container's directory, or "" for one file alone. They
// are not synced to disk: they describe processes, which no machine crash
// outlives.
func supervisorOptions(name string) record.Options[struct{}] {
	return record.Options[struct{}]{Format: supervisorFormat, Version: supervisorVersion, Name: name, Legacy: legacySupervisor, NoSync: true}
}

// legacySupervisor reads a supervisor record of version 1: the holder.
func legacySupervisor(b []byte) (record.Entry[struct{}], error) {
	var p node.Process
	if err := json.Unmarshal(b, &p); err != nil {
		return record.Entry[struct{}]{}, err
	}
	e := record.Entry[struct{}]{Phase: record.Completed, Version: 1}
	if p != (node.Process{}) {
		e.Process = &p
	}
	return e, nil
}

// supervisorEntry is the record of sup, the supervisor of container id:
// the zero Holder (a process the proc file system could not tell) has no
// process.
func supervisorEntry(id string, sup allocator.Holder) record.Entry[struct{}] {
	e := record.Entry[struct{}]{Key: id, Phase: record.Completed}
	if sup != (node.Process{}) {
		e.Process = &sup
	}
	return e
}

// writeSupervisor records sup as the supervisor of container id, in the
// directory dir (the container's, or its claim's before the rename).
func writeSupervisor(dir, id string, sup allocator.Holder) error {
	f, err := record.NewFile(filepath.Join(dir, supervisorFile), id, supervisorOptions(""))
	if err != nil {
		return err
	}
	return f.Write(supervisorEntry(id, sup))
}

// readSupervisor reads the supervisor container id's directory names.
func (r *runner) readSupervisor(id string) (allocator.Holder, error) {
	s, err := record.New(r.cfg.StateDir, supervisorOptions(supervisorFile))
	if err != nil {
		return allocator.Holder{}, err
	}
	e, err := s.Read(id)
	if err != nil {
		return allocator.Holder{}, err
	}
	if e.Process == nil {
		return allocator.Holder{}, nil
	}
	return *e.Process, nil
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
	return pid > 0 && linux.Alive(procRoot, linux.Process{Pid: pid, Start: start})
}
