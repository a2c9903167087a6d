package dra

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/gpuiso/gpuiso/internal/linux"
)

// Checkpoint states: a claim whose preparation started but did not finish
// (the process died in between) is rolled back before it is prepared again.
const (
	StatePrepareStarted   = "PrepareStarted"
	StatePrepareCompleted = "PrepareCompleted"
)

// A checkpoint is of version 1, or of version 2 when it records a share:
// a driver that knows no shares refuses such a file as corrupt rather than
// roll back a claim without stopping its share's MPS daemon.
const (
	checkpointFormat  = "gpuiso-dra-claim"
	checkpointVersion = 1
	shareVersion      = 2
)

// Checkpoint is what the driver records of one prepared claim, in its own
// file, so that a restart keeps every prepared claim.
type Checkpoint struct {
	Format    string `json:"format"`
	Version   int    `json:"version"`
	UID       string `json:"uid"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name,omitempty"`
	State     string `json:"state"`
	// Owner is the claim's owner id in the allocator and its CDI spec.
	Owner string `json:"owner"`
	// Devices are the claim's devices of this driver.
	Devices []PreparedDevice `json:"devices"`
	// Share, for a claim of a share of a GPU (then its one device), is
	// the memory share the allocator holds for it and its MPS daemon
	// enforces.
	Share *PreparedShare `json:"share,omitempty"`
	// Checksum is the SHA-256 of the record with Checksum empty.
	Checksum string `json:"checksum,omitempty"`
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
	// Admin marks a device allocated with admin access: the claim's CDI
	// spec has it, the allocator does not hold it for the claim.
	Admin bool `json:"admin,omitempty"`
}

// PreparedShare is the memory share of a claim: the memory the scheduler
// allocated it (its consumed capacity) and the compute percentage its
// configuration asks for (0: no limit).
type PreparedShare struct {
	MemoryBytes    uint64 `json:"memoryBytes"`
	ComputePercent int    `json:"computePercent,omitempty"`
}

func (cp Checkpoint) sum() (string, error) {
	cp.Checksum = ""
	b, err := json.Marshal(cp)
	if err != nil {
		return "", err
	}
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:]), nil
}

// ownerOf is claim uid's owner id in the allocator and its CDI spec.
func ownerOf(uid string) string { return "claim-" + uid }

// checkpoints is a directory of one file per claim, "<uid>.json".
type checkpoints struct{ dir string }

func (s checkpoints) path(uid string) (string, error) {
	if uid == "" || strings.ContainsAny(uid, "/\\") || uid == "." || uid == ".." {
		return "", fmt.Errorf("claim uid %q: %w", uid, ErrInvalidConfig)
	}
	return filepath.Join(s.dir, uid+".json"), nil
}

// write records c atomically: temp file, sync, rename, sync the directory.
func (s checkpoints) write(c Checkpoint) error {
	p, err := s.path(c.UID)
	if err != nil {
		return err
	}
	c.Format, c.Version = checkpointFormat, checkpointVersion
	if c.Share != nil {
		c.Version = shareVersion
	}
	if c.Checksum, err = c.sum(); err != nil {
		return err
	}
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return err
	}
	if err := linux.WriteFileAtomic(p, "", append(b, '\n'), 0o600, nil); err != nil {
		return fmt.Errorf("write claim checkpoint: %w", err)
	}
	return nil
}

// read returns the checkpoint of uid; ok is false when there is none. A
// file that does not parse, is of another format or version, or fails its
// checksum gives a *CheckpointError.
func (s checkpoints) read(uid string) (Checkpoint, bool, error) {
	p, err := s.path(uid)
	if err != nil {
		return Checkpoint{}, false, err
	}
	b, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return Checkpoint{}, false, nil
	}
	if err != nil {
		return Checkpoint{}, false, err
	}
	c, err := ParseCheckpoint(b)
	if err != nil {
		return Checkpoint{}, false, &CheckpointError{Path: p, Err: err}
	}
	if c.UID != uid {
		return Checkpoint{}, false, &CheckpointError{Path: p, Err: fmt.Errorf("records claim %q", c.UID)}
	}
	// The owner names what a rollback releases and which CDI spec it
	// removes: a claim's is always its own.
	if c.Owner != ownerOf(uid) {
		return Checkpoint{}, false, &CheckpointError{Path: p, Err: fmt.Errorf("records owner %q, not %q", c.Owner, ownerOf(uid))}
	}
	return c, true, nil
}

// ParseCheckpoint reads a checkpoint file's content and checks its format,
// version and checksum.
func ParseCheckpoint(b []byte) (Checkpoint, error) {
	var c Checkpoint
	if err := json.Unmarshal(b, &c); err != nil {
		return Checkpoint{}, err
	}
	if c.Format != checkpointFormat || (c.Version != checkpointVersion && c.Version != shareVersion) {
		return Checkpoint{}, fmt.Errorf("format %q version %d, want %q %d or %d", c.Format, c.Version, checkpointFormat, checkpointVersion, shareVersion)
	}
	if (c.Share != nil) != (c.Version == shareVersion) {
		return Checkpoint{}, fmt.Errorf("version %d with share %v", c.Version, c.Share)
	}
	if sh := c.Share; sh != nil && (sh.MemoryBytes == 0 || sh.ComputePercent < 0 || sh.ComputePercent > 100 || len(c.Devices) != 1) {
		return Checkpoint{}, fmt.Errorf("share of %d bytes, %d%% compute, on %d devices", sh.MemoryBytes, sh.ComputePercent, len(c.Devices))
	}
	sum, err := c.sum()
	if err != nil {
		return Checkpoint{}, err
	}
	if sum != c.Checksum {
		return Checkpoint{}, errors.New("checksum mismatch")
	}
	if c.State != StatePrepareStarted && c.State != StatePrepareCompleted {
		return Checkpoint{}, fmt.Errorf("unknown state %q", c.State)
	}
	return c, nil
}

func (s checkpoints) remove(uid string) error {
	p, err := s.path(uid)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return linux.SyncDir(s.dir)
}

// exists reports whether uid has a checkpoint file, whatever its content.
func (s checkpoints) exists(uid string) bool {
	p, err := s.path(uid)
	if err != nil {
		return false
	}
	_, err = os.Lstat(p)
	return err == nil
}

// list returns the uids with a checkpoint file, sorted.
func (s checkpoints) list() ([]string, error) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if uid, ok := strings.CutSuffix(e.Name(), ".json"); ok && !strings.HasPrefix(e.Name(), ".") {
			out = append(out, uid)
		}
	}
	sort.Strings(out)
	return out, nil
}
