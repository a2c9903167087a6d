package dra

import (
	"errors"
	"fmt"
	"strings"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/record"
)

// Checkpoint states: a claim whose preparation started but did not finish
// (the process died in between) is rolled back before it is prepared again.
const (
	StatePrepareStarted   = "PrepareStarted"
	StatePrepareCompleted = "PrepareCompleted"
)

// A checkpoint is an entry of a record store (package record of the
// core) of format "gpuiso-dra-claim", version 3: the
// claim's uid is its key, its state the entry's phase. Versions 1 and 2
// were files of their own shape (version 2 when the claim holds a share,
// so that a driver that knew no shares refused it rather than roll back a
// claim without stopping its share's MPS daemon); they are read still
// (see checkpoint_legacy.go), and a driver that knows only them refuses
// version 3 as corrupt.
const (
	checkpointFormat  = "gpuiso-dra-claim"
	checkpointVersion = 1
	shareVersion      = 2
	recordVersion     = 3
)

// Checkpoint is what the driver records of one prepared claim, in its own
// file, so that a restart keeps every prepared claim.
type Checkpoint struct {
	// UID is the claim's uid, the key of its record.
	UID       string `json:"-"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name,omitempty"`
	// State is StatePrepareStarted or StatePrepareCompleted: the phase of
	// its record (record.Started, record.Completed).
	State string `json:"-"`
	// Owner is the claim's owner id in the allocator and its CDI spec.
	Owner string `json:"owner"`
	// Devices are the claim's devices of this driver.
	Devices []PreparedDevice `json:"devices"`
	// Share, for a claim of a share of a GPU (then its one device), is
	// the share the allocator holds for it: a memory share its MPS daemon
	// enforces, a time slice or a concurrent slice.
	Share *PreparedShare `json:"share,omitempty"`
}

// PreparedDevice is one device of a prepared claim.
type PreparedDevice struct {
	Requests     []string `json:"requests"`
	Pool         string   `json:"pool"`
	Device       string   `json:"device"`
	UUID         string   `json:"uuid"`
	CDIDeviceIDs []string `json:"cdiDeviceIDs,omitempty"`
	// ShareID is the allocation's share id, for a share of a GPU.
	ShareID string `json:"shareID,omitempty"`
	// MIG, for a dynamic MIG device, is the MIG device made for the
	// claim at the placement it was allocated.
	MIG *PreparedMIG `json:"mig,omitempty"`
	// Admin marks a device allocated with admin access: the claim's CDI
	// spec has it, the allocator does not hold it for the claim.
	Admin bool `json:"admin,omitempty"`
	// tolerations are the allocation's tolerations of the device, read
	// when it is unhealthy (not recorded).
	tolerations deviceTolerations
}

// PreparedShare is the share of a claim. A memory share (Mode empty) has
// the memory the scheduler allocated it (its consumed capacity) and the
// compute percentage its configuration asks for (0: no limit); a time
// slice (allocator.ShareTime) has neither; a concurrent slice
// (allocator.ShareSlice) has its count, Slices, and no memory of its own
// (the allocator gives it its GPU's memory divided by Slices). A driver
// that knew memory shares alone reads a slice as a memory share of no
// memory, which it refuses rather than hold the GPU as something else.
type PreparedShare struct {
	MemoryBytes    uint64              `json:"memoryBytes"`
	ComputePercent int                 `json:"computePercent,omitempty"`
	Mode           allocator.ShareMode `json:"mode,omitempty"`
	Slices         int                 `json:"slices,omitempty"`
}

// check reports whether p is a share the driver prepares: a memory share
// of some memory, a time slice or a concurrent slice with no memory
// recorded, each valid as an allocator.Share with every field p has.
func (p PreparedShare) check() error {
	if p.Mode == allocator.ShareSlice && p.MemoryBytes != 0 {
		return fmt.Errorf("a concurrent slice of %d bytes: %w", p.MemoryBytes, allocator.ErrInvalidRequest)
	}
	return allocator.Share{Mode: p.Mode, MemoryBytes: p.MemoryBytes, ComputePercent: p.ComputePercent, Slices: p.Slices}.Validate()
}

// daemon reports whether p has an MPS daemon: a memory share its own, a
// concurrent slice its GPU's.
func (p PreparedShare) daemon() bool { return p.Mode != allocator.ShareTime }

// claimOwnerPrefix starts the owner id of every claim of the driver's.
const claimOwnerPrefix = "claim-"

// ownerOf is claim uid's owner id in the allocator and its CDI spec.
func ownerOf(uid string) string { return claimOwnerPrefix + uid }

// claimOf is the uid of the claim whose owner id is owner (ownerOf), and
// whether owner is one.
func claimOf(owner string) (string, bool) { return strings.CutPrefix(owner, claimOwnerPrefix) }

// checkpoints is a directory of one file per claim, "<uid>.json": a
// record store of Checkpoints.
type checkpoints struct{ dir string }

func checkpointOptions() record.Options[Checkpoint] {
	return record.Options[Checkpoint]{Format: checkpointFormat, Version: recordVersion, Legacy: parseLegacy}
}

// store is the record store of the directory (its options are valid).
func (s checkpoints) store() *record.Store[Checkpoint] {
	st, _ := record.New(s.dir, checkpointOptions())
	return st
}

func (s checkpoints) key(uid string) error {
	if err := record.ValidKey(uid); err != nil {
		return fmt.Errorf("claim uid %q: %w: %w", uid, ErrInvalidConfig, err)
	}
	return nil
}

// phases maps a checkpoint's state to its record's phase.
var phases = map[string]record.Phase{StatePrepareStarted: record.Started, StatePrepareCompleted: record.Completed}

// write records c atomically (temp file, sync, rename, sync the
// directory).
func (s checkpoints) write(c Checkpoint) error {
	if err := s.key(c.UID); err != nil {
		return err
	}
	ph, ok := phases[c.State]
	if !ok {
		return fmt.Errorf("claim %s: state %q: %w", c.UID, c.State, ErrInvalidConfig)
	}
	if err := s.store().Write(record.Entry[Checkpoint]{Key: c.UID, Phase: ph, Data: c}); err != nil {
		return fmt.Errorf("write claim checkpoint: %w", err)
	}
	return nil
}

// read returns the checkpoint of uid; ok is false when there is none. A
// file that does not parse, is of another format or version, fails its
// checksum, records another claim or an owner not its own gives a
// *CheckpointError.
func (s checkpoints) read(uid string) (Checkpoint, bool, error) {
	if err := s.key(uid); err != nil {
		return Checkpoint{}, false, err
	}
	st := s.store()
	e, err := st.Read(uid)
	if errors.Is(err, record.ErrNoRecord) {
		return Checkpoint{}, false, nil
	}
	p, _ := st.Path(uid)
	if errors.Is(err, record.ErrCorrupt) {
		return Checkpoint{}, false, &CheckpointError{Path: p, Err: err}
	}
	if err != nil {
		return Checkpoint{}, false, err
	}
	c, err := checkpointOf(e)
	if err != nil {
		return Checkpoint{}, false, &CheckpointError{Path: p, Err: err}
	}
	// The owner names what a rollback releases and which CDI spec it
	// removes: a claim's is always its own.
	if c.Owner != ownerOf(uid) {
		return Checkpoint{}, false, &CheckpointError{Path: p, Err: fmt.Errorf("records owner %q, not %q", c.Owner, ownerOf(uid))}
	}
	return c, true, nil
}

// ParseCheckpoint reads a checkpoint file's content, of any version this
// driver wrote, and checks its format, version, checksum and share.
func ParseCheckpoint(b []byte) (Checkpoint, error) {
	e, err := checkpoints{}.store().Parse(b)
	if err != nil {
		return Checkpoint{}, err
	}
	return checkpointOf(e)
}

// checkpointOf is the checkpoint an entry holds, its share checked.
func checkpointOf(e record.Entry[Checkpoint]) (Checkpoint, error) {
	c := e.Data
	c.UID = e.Key
	switch e.Phase {
	case record.Started:
		c.State = StatePrepareStarted
	case record.Completed:
		c.State = StatePrepareCompleted
	}
	if sh := c.Share; sh != nil {
		if err := sh.check(); err != nil {
			return Checkpoint{}, fmt.Errorf("share of %d bytes, %d%% compute, on %d devices: %w", sh.MemoryBytes, sh.ComputePercent, len(c.Devices), err)
		}
		if len(c.Devices) != 1 {
			return Checkpoint{}, fmt.Errorf("share of %d bytes, %d%% compute, on %d devices", sh.MemoryBytes, sh.ComputePercent, len(c.Devices))
		}
	}
	return c, nil
}

func (s checkpoints) remove(uid string) error {
	if err := s.key(uid); err != nil {
		return err
	}
	return s.store().Remove(uid)
}

// exists reports whether uid has a checkpoint file, whatever its content.
func (s checkpoints) exists(uid string) bool { return s.store().Exists(uid) }

// list returns the uids with a checkpoint file, sorted.
func (s checkpoints) list() ([]string, error) { return s.store().List() }
