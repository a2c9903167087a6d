package chain

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/record"
)

// A container's record is an entry of the state directory's record store
// (package containerizer/record): "<id>.json", of format
// "gpuiso-chain-container", version 2. Version 1, the isolator's own shape
// before the store, is read still.
const (
	recordFormat  = "gpuiso-chain-container"
	recordVersion = 2
)

// Phases of a container's record.
const (
	// phasePreparing: Prepare has started; it may hold an allocation and a
	// volume use that no caller knows of yet.
	phasePreparing = record.Started
	// phasePrepared: Prepare returned; the agent knows the container.
	phasePrepared = record.Completed
)

// held is what the isolator keeps of one container in its state
// directory, so that a restarted agent's Recover finds what it holds.
type held struct {
	// ID and Phase are the record's key and phase.
	ID    string       `json:"-"`
	Phase record.Phase `json:"-"`
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

// records is the record store of the state directory dir.
func records(dir string) *record.Store[held] {
	s, _ := record.New(dir, record.Options[held]{Format: recordFormat, Version: recordVersion, Legacy: legacyRecord}) // valid options
	return s
}

// legacyRecord reads a record of version 1: the fields of held with the
// id, the phase ("preparing", "prepared") and the version beside them.
func legacyRecord(b []byte) (record.Entry[held], error) {
	var r struct {
		Version int    `json:"version"`
		ID      string `json:"id"`
		Phase   string `json:"phase"`
		held
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return record.Entry[held]{}, err
	}
	phase := map[string]record.Phase{"preparing": phasePreparing, "prepared": phasePrepared}[r.Phase]
	if r.Version != 1 || phase == "" {
		return record.Entry[held]{}, fmt.Errorf("version %d, phase %q", r.Version, r.Phase)
	}
	return record.Entry[held]{Key: r.ID, Phase: phase, Version: 1, Data: r.held}, nil
}

// write replaces id's record atomically (temp file, fsync, rename, fsync
// of the directory).
func (i *Isolator) write(r held) error {
	if err := i.recs.Write(record.Entry[held]{Key: r.ID, Phase: r.Phase, Data: r}); err != nil {
		return fmt.Errorf("record of %s: %w", r.ID, err)
	}
	return nil
}

// read returns id's record; ErrUnknownContainer when it has none.
func (i *Isolator) read(id string) (held, error) {
	e, err := i.recs.Read(id)
	switch {
	case errors.Is(err, record.ErrNoRecord):
		return held{}, ErrUnknownContainer
	case errors.Is(err, record.ErrCorrupt):
		return held{}, fmt.Errorf("record of %s: %w: %w", id, ErrCorruptRecord, err)
	case err != nil:
		return held{}, fmt.Errorf("record of %s: %w", id, err)
	}
	r := e.Data
	r.ID, r.Phase = e.Key, e.Phase
	return r, nil
}

// remove deletes id's record; one already gone is not an error.
func (i *Isolator) remove(id string) error {
	if err := i.recs.Remove(id); err != nil {
		return fmt.Errorf("record of %s: %w", id, err)
	}
	return nil
}

// ids lists the containers that have a record, sorted. Temporary files of
// an interrupted write are removed.
func (i *Isolator) ids() ([]string, error) {
	if err := i.recs.Clean(); err != nil {
		return nil, fmt.Errorf("container records: %w", err)
	}
	keys, err := i.recs.List()
	if err != nil {
		return nil, fmt.Errorf("container records: %w", err)
	}
	out := keys[:0]
	for _, id := range keys {
		if node.ValidateOwner(id) == nil {
			out = append(out, id)
		}
	}
	return out, nil
}
