package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/record"
)

// record is what a state directory keeps of one container: an entry of
// the directory's record store (package record), STATE/gpuiso-runtime/
// OWNER.json, of format "gpuiso-runtime-container", version 2, whose key
// is the owner, whose phase is the record's ("creating" is Started,
// "created" Completed) and whose process is the container's init. Version
// 1, the record's own checksummed shape before the store, is read still.
type ctrRecord struct {
	// Version is the version the record was read in (1 for the record's
	// own shape, which also carries the fields below).
	Version int    `json:"version"`
	Owner   string `json:"owner"`
	// ID and Root are the container's id and runc root; Runc is the runc
	// asked for its state.
	ID   string `json:"id"`
	Root string `json:"root"`
	Runc string `json:"runc"`
	// Bundle is the bundle it was created from (resolved).
	Bundle string `json:"bundle"`
	// Simulate and DevRoot name the node the claim was made on.
	Simulate string `json:"simulate,omitempty"`
	DevRoot  string `json:"devRoot,omitempty"`
	Phase    string `json:"phase"`
	// Init is the container's init, once created.
	Init *allocator.Holder `json:"init,omitempty"`
	// Sum is the SHA-256 of a record of version 1 with Sum empty.
	Sum string `json:"sum"`
}

// claimData is what an entry holds of a record beside its key, phase and
// process.
type claimData struct {
	ID       string `json:"id"`
	Root     string `json:"root"`
	Runc     string `json:"runc"`
	Bundle   string `json:"bundle"`
	Simulate string `json:"simulate,omitempty"`
	DevRoot  string `json:"devRoot,omitempty"`
}

const (
	recordFormat  = "gpuiso-runtime-container"
	recordVersion = 2
	phaseCreating = "creating"
	phaseCreated  = "created"

	indexFormat  = "gpuiso-runtime-index"
	indexVersion = 2
)

// phases are the records' phases as the store's.
func phaseOf(p string) record.Phase {
	if p == phaseCreated {
		return record.Completed
	}
	if p == phaseCreating {
		return record.Started
	}
	return record.Phase(p) // refused by the store
}

// entryOf is r as an entry of the store.
func entryOf(r ctrRecord) record.Entry[claimData] {
	e := record.Entry[claimData]{Key: r.Owner, Phase: phaseOf(r.Phase), Data: claimData{
		ID: r.ID, Root: r.Root, Runc: r.Runc, Bundle: r.Bundle, Simulate: r.Simulate, DevRoot: r.DevRoot,
	}}
	if r.Init != nil {
		p := *r.Init
		e.Process = &p
	}
	return e
}

// recordOf is the record e holds.
func recordOf(e record.Entry[claimData]) ctrRecord {
	r := ctrRecord{Version: e.Version, Owner: e.Key, ID: e.Data.ID, Root: e.Data.Root, Runc: e.Data.Runc,
		Bundle: e.Data.Bundle, Simulate: e.Data.Simulate, DevRoot: e.Data.DevRoot, Phase: phaseCreating}
	if e.Phase == record.Completed {
		r.Phase = phaseCreated
	}
	if e.Process != nil {
		h := *e.Process
		r.Init = &h
	}
	return r
}

// legacySum is the checksum of a record of version 1: the SHA-256 of its
// JSON with Sum empty.
func (r ctrRecord) legacySum() string {
	r.Sum = ""
	b, _ := json.Marshal(r)
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// legacyRecord reads a record of version 1, checked as that version was.
func legacyRecord(b []byte) (record.Entry[claimData], error) {
	var r ctrRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return record.Entry[claimData]{}, err
	}
	switch {
	case r.Version != 1:
		return record.Entry[claimData]{}, fmt.Errorf("version %d", r.Version)
	case r.Sum != r.legacySum():
		return record.Entry[claimData]{}, errors.New("checksum mismatch")
	case r.Phase != phaseCreating && r.Phase != phaseCreated:
		return record.Entry[claimData]{}, fmt.Errorf("phase %q", r.Phase)
	}
	e := entryOf(r)
	e.Version = 1
	return e, nil
}

// recordOptions are the options of the records' store: synced, as the
// claims they record outlive a machine crash (the allocator's state does).
func recordOptions() record.Options[claimData] {
	return record.Options[claimData]{Format: recordFormat, Version: recordVersion, Legacy: legacyRecord}
}

// parseRecord reads the record of owner from b: an entry of the store (or
// a record of version 1) of owner, with an id, absolute root and runc, and
// an init once created.
func parseRecord(owner string, b []byte) (ctrRecord, error) {
	s, err := record.New("", recordOptions())
	if err != nil {
		return ctrRecord{}, err
	}
	e, err := s.Parse(b)
	if err != nil {
		return ctrRecord{}, fmt.Errorf("record of %s: %w: %w", owner, ErrCorruptRecord, err)
	}
	if e.Key != owner {
		return ctrRecord{}, fmt.Errorf("record of %s: %w: owner %q", owner, ErrCorruptRecord, e.Key)
	}
	return checkRecord(owner, recordOf(e))
}

// checkRecord refuses a record without an id, with a root or runc that is
// not absolute, or created without its init.
func checkRecord(owner string, r ctrRecord) (ctrRecord, error) {
	switch {
	case r.Owner != owner || r.ID == "" || !filepath.IsAbs(r.Root) || !filepath.IsAbs(r.Runc):
		return ctrRecord{}, fmt.Errorf("record of %s: %w: owner %q, id %q, root %q, runc %q", owner, ErrCorruptRecord, r.Owner, r.ID, r.Root, r.Runc)
	case r.Phase == phaseCreated && r.Init == nil:
		return ctrRecord{}, fmt.Errorf("record of %s: %w: phase %q, init %v", owner, ErrCorruptRecord, r.Phase, r.Init)
	}
	return r, nil
}

// records are the container records of one state directory, with the index
// that finds them.
type records struct {
	dir   string // STATE/gpuiso-runtime
	index string // the index directory
}

// recordsOf returns the records of state directory stateDir.
func (rt *Runtime) recordsOf(stateDir string) (records, error) {
	dir, err := filepath.Abs(stateDir)
	if err != nil {
		return records{}, err
	}
	index := rt.IndexDir
	if index == "" {
		index = defaultIndexDir
	}
	return records{dir: filepath.Join(dir, recordsDir), index: index}, nil
}

func (rs records) path(owner string) string { return filepath.Join(rs.dir, owner+".json") }

// stateDir is the state directory the records belong to.
func (rs records) stateDir() string { return filepath.Dir(rs.dir) }

// store is the records' store.
func (rs records) store() *record.Store[claimData] {
	s, _ := record.New(rs.dir, recordOptions()) // valid options
	return s
}

// read reads owner's record: an error matching fs.ErrNotExist when there
// is none, ErrCorruptRecord when it cannot be trusted.
func (rs records) read(owner string) (ctrRecord, error) {
	e, err := rs.store().Read(owner)
	if errors.Is(err, record.ErrNoRecord) {
		return ctrRecord{}, fmt.Errorf("record of %s: %w: %w", owner, err, fs.ErrNotExist)
	}
	if errors.Is(err, record.ErrCorrupt) {
		return ctrRecord{}, fmt.Errorf("record of %s: %w: %w", owner, ErrCorruptRecord, err)
	}
	if err != nil {
		return ctrRecord{}, err
	}
	return checkRecord(owner, recordOf(e))
}

// write replaces r's record atomically (temp file, fsync, rename, fsync of
// the directory).
func (rs records) write(r ctrRecord) error {
	if err := privateDir(rs.dir); err != nil {
		return fmt.Errorf("record of %s: %w", r.Owner, err)
	}
	if err := rs.store().Write(entryOf(r)); err != nil {
		return fmt.Errorf("record of %s: %w", r.Owner, err)
	}
	return nil
}

// indexEntry is what the index keeps of an owner: an entry of the index
// directory's record store, OWNER.json, of format "gpuiso-runtime-index",
// version 2, keyed by the owner. Version 1, this JSON alone, is read
// still.
type indexEntry struct {
	StateDir string `json:"stateDir"`
}

// legacyIndex reads an index entry of version 1.
func legacyIndex(b []byte) (record.Entry[indexEntry], error) {
	var e indexEntry
	if err := json.Unmarshal(b, &e); err != nil {
		return record.Entry[indexEntry]{}, err
	}
	return record.Entry[indexEntry]{Phase: record.Completed, Version: 1, Data: e}, nil
}

// indexOf is the store of index directory dir. The index lives as long as
// the containers (a tmpfs): no sync.
func indexOf(dir string) *record.Store[indexEntry] {
	s, _ := record.New(dir, record.Options[indexEntry]{Format: indexFormat, Version: indexVersion, Legacy: legacyIndex, NoSync: true}) // valid options
	return s
}

// writeIndex points owner's index entry at this state directory.
func (rs records) writeIndex(owner string) error {
	if err := privateDir(rs.index); err != nil {
		return fmt.Errorf("index of %s: %w", owner, err)
	}
	e := record.Entry[indexEntry]{Key: owner, Phase: record.Completed, Data: indexEntry{StateDir: rs.stateDir()}}
	if err := indexOf(rs.index).Write(e); err != nil {
		return fmt.Errorf("index of %s: %w", owner, err)
	}
	return nil
}

// lookupIndex returns the state directory index names for owner, or "".
func lookupIndex(index, owner string) string {
	e, err := indexOf(index).Read(owner)
	if err != nil || !filepath.IsAbs(e.Data.StateDir) {
		return ""
	}
	return e.Data.StateDir
}

// remove deletes owner's record, its index entry (when it points here) and
// its lock file, whose lock the caller holds in lock and which is closed.
func (rs records) remove(owner string, lock *os.File) error {
	defer lock.Close()
	if err := rs.store().Remove(owner); err != nil {
		return fmt.Errorf("record of %s: %w", owner, err)
	}
	if lookupIndex(rs.index, owner) == rs.stateDir() {
		indexOf(rs.index).Remove(owner)
	}
	// Unlinked while locked: a process waiting for it finds it gone and
	// opens the path again (lock).
	os.Remove(rs.lockPath(owner))
	return linux.SyncDir(rs.dir)
}

func (rs records) lockPath(owner string) string { return filepath.Join(rs.dir, owner+".lock") }

// ErrStrangerDir: a directory of records, or of the index, belongs to
// another user, who could read, replace or lock what it holds.
var ErrStrangerDir = node.Sentinel(node.ErrInvalid, "directory of another user")

// privateDir makes dir (and its parents) if it is missing and checks that
// it is a directory of this process's user that no other user may list or
// enter (0700): one that is group- or world-accessible, left by an earlier
// release, is made so; one of another user, or a link, is refused. The
// records, the index and the lock files are then reached by nobody else:
// no stranger can read which containers there are, nor take a lock that
// stalls a create or a delete.
func privateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	uid, ok := linux.Owner(fi)
	switch {
	case !fi.IsDir():
		return withRemedy(fmt.Errorf("%s: %s, not a directory: %w", dir, fi.Mode().Type(), ErrStrangerDir),
			"remove it, and let gpuiso-runtime make the directory")
	case !ok || int(uid) != os.Geteuid():
		return withRemedy(fmt.Errorf("%s: owned by uid %d, not %d: %w", dir, uid, os.Geteuid(), ErrStrangerDir),
			"remove it (what it holds is not gpuiso-runtime's), and let gpuiso-runtime make it again")
	case fi.Mode().Perm() != 0o700:
		return os.Chmod(dir, 0o700)
	}
	return nil
}

// lock takes owner's lock file: at once, or waiting up to wait (and ctx);
// ErrContainerBusy when another process keeps it. The lock file is 0600 in
// the records' private directory.
func (rs records) lock(ctx context.Context, owner string, wait time.Duration) (*os.File, error) {
	if err := privateDir(rs.dir); err != nil {
		return nil, err
	}
	path := rs.lockPath(owner)
	for {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return nil, err
		}
		fi, err := f.Stat()
		if err == nil && fi.Mode().Perm() != 0o600 {
			err = f.Chmod(0o600) // left wider by an earlier release
		}
		// A zero wait is one try: the context is over at once.
		wctx, cancel := context.WithTimeout(ctx, wait)
		if err == nil {
			err = linux.Lock(wctx, f)
		}
		busy := err != nil && wctx.Err() != nil
		cancel()
		if err != nil {
			f.Close()
			if busy {
				return nil, ErrContainerBusy
			}
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		held, err1 := f.Stat()
		now, err2 := os.Stat(path)
		if err1 == nil && err2 == nil && os.SameFile(held, now) {
			return f, nil
		}
		f.Close() // removed by its last holder: take the new one
	}
}

// owners lists the owners that have a record. (A lock file without one,
// left by a crash as its record went, stays: it holds nothing.)
func (rs records) owners() ([]string, error) {
	entries, err := os.ReadDir(rs.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		name := e.Name()
		if owner, ok := strings.CutSuffix(name, ".json"); ok && !strings.HasPrefix(name, ".") {
			out = append(out, owner)
		}
	}
	return out, nil
}
