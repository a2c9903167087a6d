package chain

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/node"
)

// recordVersion is the format of a container's record.
const recordVersion = 1

// Phases of a container's record.
const (
	// phasePreparing: Prepare has started; it may hold an allocation and a
	// volume use that no caller knows of yet.
	phasePreparing = "preparing"
	// phasePrepared: Prepare returned; the agent knows the container.
	phasePrepared = "prepared"
)

// record is what the isolator keeps of one container in its state
// directory, so that a restarted agent's Recover finds what it holds.
type record struct {
	Version int    `json:"version"`
	ID      string `json:"id"`
	Phase   string `json:"phase"`
	// GPUs are the UUIDs of the devices the container holds.
	GPUs []string `json:"gpus,omitempty"`
	// Share is the share of its one GPU the container holds, or nil.
	Share *allocator.Share `json:"share,omitempty"`
	// Volume is the driver volume version the container uses, or "".
	Volume string `json:"volume,omitempty"`
	// Cgroup is the agent's own cgroup the rules are enforced on
	// (IsolateCgroup), relative to the hierarchy's mount; "" means the
	// isolator's own device cgroup.
	Cgroup string `json:"cgroup,omitempty"`
}

const recordExt = ".json"

func (i *Isolator) recordPath(id string) string {
	return filepath.Join(i.dir, id+recordExt)
}

// write replaces id's record atomically (temp file, fsync, rename, fsync
// of the directory).
func (i *Isolator) write(r record) error {
	r.Version = recordVersion
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if err := linux.WriteFileAtomic(i.recordPath(r.ID), "", b, 0o600, nil); err != nil {
		return fmt.Errorf("record of %s: %w", r.ID, err)
	}
	return nil
}

// read returns id's record; ErrUnknownContainer when it has none.
func (i *Isolator) read(id string) (record, error) {
	b, err := os.ReadFile(i.recordPath(id))
	if errors.Is(err, fs.ErrNotExist) {
		return record{}, ErrUnknownContainer
	}
	if err != nil {
		return record{}, fmt.Errorf("record of %s: %w", id, err)
	}
	var r record
	if err := json.Unmarshal(b, &r); err != nil {
		return record{}, fmt.Errorf("record of %s: %w: %w", id, ErrCorruptRecord, err)
	}
	if r.Version != recordVersion || r.ID != id || (r.Phase != phasePreparing && r.Phase != phasePrepared) {
		return record{}, fmt.Errorf("record of %s: %w: version %d, id %q, phase %q", id, ErrCorruptRecord, r.Version, r.ID, r.Phase)
	}
	return r, nil
}

// remove deletes id's record; one already gone is not an error.
func (i *Isolator) remove(id string) error {
	if err := os.Remove(i.recordPath(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("record of %s: %w", id, err)
	}
	return linux.SyncDir(i.dir)
}

// ids lists the containers that have a record, sorted. Temporary files of
// an interrupted write are removed.
func (i *Isolator) ids() ([]string, error) {
	entries, err := os.ReadDir(i.dir)
	if err != nil {
		return nil, fmt.Errorf("container records: %w", err)
	}
	var out []string
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") && strings.HasSuffix(name, ".tmp") {
			os.Remove(filepath.Join(i.dir, name))
			continue
		}
		id, ok := strings.CutSuffix(name, recordExt)
		if ok && e.Type().IsRegular() && node.ValidateOwner(id) == nil {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out, nil
}
