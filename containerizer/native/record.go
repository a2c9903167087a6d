package native

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/node"
)

// record is what survives a restart of the containerizer: one per container,
// in <state dir>/<id>/container.json.
type record struct {
	Version int              `json:"version"`
	ID      string           `json:"id"`
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
	// (clock ticks since boot), which guards against pid reuse.
	Pid   int    `json:"pid,omitempty"`
	Start uint64 `json:"start,omitempty"`
}

const recordVersion = 1

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
