package allocator

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/record"
)

// StateFile is the name of the state file in the state directory.
const StateFile = "allocations.json"

// State file format: a JSON envelope naming the format and its version,
// with a SHA-256 checksum of the state's exact bytes. This is what the
// allocator writes, and what every earlier release reads.
const (
	stateFormat  = "gpuiso.allocator.state"
	stateVersion = 1
	maxStateSize = 64 << 20
)

// The state as an entry of package record (format
// "gpuiso-allocator-state", version 2, key "allocations"): read as well,
// so that a release that writes it shares a state directory with this
// one.
const (
	entryFormat  = "gpuiso-allocator-state"
	entryVersion = 2
	entryKey     = "allocations"
)

// stateCodec is the codec of the state as a record entry; its data is
// decoded strictly by decodeState.
func stateCodec() (*record.Codec[json.RawMessage], error) {
	return record.NewCodec(record.Options[json.RawMessage]{Format: entryFormat, Version: entryVersion})
}

type envelope struct {
	Format   string          `json:"format"`
	Version  int             `json:"version"`
	Checksum string          `json:"checksum"`
	State    json.RawMessage `json:"state"`
}

// savedState is what the state file holds. Devices are named by UUID and
// bus id, which are stable across restarts; the index is informative.
type savedState struct {
	Owners    []savedOwner  `json:"owners"`
	Unhealthy []savedHealth `json:"unhealthy,omitempty"`
	// UnhealthyMIG are MIG devices marked unhealthy (optional: files
	// written before MIG support have none).
	UnhealthyMIG []savedMIGHealth `json:"unhealthyMig,omitempty"`
}

type savedDevice struct {
	Index int    `json:"index"`
	UUID  string `json:"uuid,omitempty"`
	BusID string `json:"busId,omitempty"`
}

type savedOwner struct {
	Owner       string        `json:"owner"`
	Group       string        `json:"group,omitempty"`
	Devices     []savedDevice `json:"devices,omitempty"`
	Shared      *savedDevice  `json:"shared,omitempty"`
	MemoryBytes uint64        `json:"memoryBytes,omitempty"`
	// ShareMode and ComputePercent describe a share (optional: files
	// written before time slices hold memory shares without them).
	ShareMode      ShareMode `json:"shareMode,omitempty"`
	ComputePercent int       `json:"computePercent,omitempty"`
	// Slices is a concurrent slice's count (optional: files written
	// before concurrent slices have none).
	Slices int `json:"slices,omitempty"`
	// MIG are the MIG devices held (optional, see savedMIG); one MIG
	// device beside a share's fields (a mode other than memory, or a
	// memory) is a share of that MIG device, not the device whole.
	MIG    []savedMIG `json:"mig,omitempty"`
	Holder *Holder    `json:"holder,omitempty"`
}

type savedHealth struct {
	Device savedDevice `json:"device"`
	Reason string      `json:"reason"`
}

// encodeState writes s in the file format.
func encodeState(s *savedState) ([]byte, error) {
	body, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(body)
	out, err := json.Marshal(envelope{Format: stateFormat, Version: stateVersion, Checksum: "sha256:" + hex.EncodeToString(sum[:]), State: body})
	if err != nil {
		return nil, err
	}
	return append(out, '\n'), nil
}

// decodeState reads the file format; every defect is an ErrCorruptState.
func decodeState(b []byte) (*savedState, error) {
	corrupt := func(format string, args ...any) error {
		return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), ErrCorruptState)
	}
	if len(bytes.TrimSpace(b)) == 0 {
		return nil, corrupt("empty")
	}
	var body []byte
	var probe struct {
		Format string `json:"format"`
	}
	if json.Unmarshal(b, &probe) == nil && probe.Format == entryFormat {
		c, err := stateCodec()
		if err != nil {
			return nil, err
		}
		e, err := c.Decode(b)
		if err != nil {
			return nil, corrupt("%v", err)
		}
		if e.Key != entryKey || e.Phase != record.Completed || e.Process != nil {
			return nil, corrupt("entry %q, phase %s: not the allocator's state", e.Key, e.Phase)
		}
		body = e.Data
	} else {
		var err error
		if body, err = decodeEnvelope(b, corrupt); err != nil {
			return nil, err
		}
	}
	var s savedState
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return nil, corrupt("state: %v", err)
	}
	if dec.More() {
		return nil, corrupt("data after the state")
	}
	return &s, checkState(&s, corrupt)
}

// decodeEnvelope returns the state's bytes from the allocator's own
// envelope, checked.
func decodeEnvelope(b []byte, corrupt func(format string, args ...any) error) ([]byte, error) {
	var env envelope
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&env); err != nil {
		return nil, corrupt("truncated or not JSON: %v", err)
	}
	if dec.More() {
		return nil, corrupt("data after the state")
	}
	if env.Format != stateFormat {
		return nil, corrupt("format %q, want %q", env.Format, stateFormat)
	}
	if env.Version != stateVersion {
		return nil, corrupt("format version %d, this program reads %d", env.Version, stateVersion)
	}
	sum := sha256.Sum256(env.State)
	if env.Checksum != "sha256:"+hex.EncodeToString(sum[:]) {
		return nil, corrupt("checksum mismatch")
	}
	return env.State, nil
}

// checkState refuses a state whose owners are not valid, listed twice, or
// hold other than exactly one kind of thing.
func checkState(s *savedState, corrupt func(format string, args ...any) error) error {
	seen := map[string]bool{}
	for _, o := range s.Owners {
		if err := node.ValidateOwner(o.Owner); err != nil {
			return corrupt("%v", err)
		}
		if seen[o.Owner] {
			return corrupt("owner %s listed twice", o.Owner)
		}
		seen[o.Owner] = true
		kinds := 0
		for _, has := range []bool{len(o.Devices) > 0, o.Shared != nil, len(o.MIG) > 0} {
			if has {
				kinds++
			}
		}
		if kinds != 1 {
			return corrupt("owner %s must hold either whole GPUs, one share or MIG devices", o.Owner)
		}
		if o.Shared != nil || len(o.MIG) == 1 && (o.ShareMode != "" || o.MemoryBytes != 0) {
			if err := (Share{Mode: o.ShareMode, MemoryBytes: o.MemoryBytes, ComputePercent: o.ComputePercent, Slices: o.Slices}).Validate(); err != nil {
				return corrupt("owner %s: %v", o.Owner, err)
			}
		} else if o.ShareMode != "" || o.MemoryBytes != 0 || o.ComputePercent != 0 || o.Slices != 0 {
			return corrupt("owner %s describes a share it does not hold", o.Owner)
		}
	}
	return nil
}

// snapshot is the allocator's state to save. The caller holds a.mu.
func (a *Allocator) snapshot() *savedState {
	s := &savedState{Owners: make([]savedOwner, 0, len(a.owners))}
	for o, h := range a.owners {
		so := savedOwner{Owner: o, Group: h.group, Holder: h.holder}
		for _, p := range a.positions(h.devices) {
			so.Devices = append(so.Devices, a.saved(p))
		}
		if h.shared >= 0 {
			d := a.saved(h.shared)
			so.Shared, so.MemoryBytes, so.ComputePercent, so.Slices = &d, h.memory, h.compute, h.slices
			if h.mode != ShareMemory {
				so.ShareMode = h.mode
			}
		}
		so.MIG = a.savedMIGs(h.mig)
		if k, ok := h.migShare(); ok {
			so.MIG = a.savedMIGs([]int{k})
			so.MemoryBytes, so.ComputePercent, so.Slices = h.memory, h.compute, h.slices
			if h.mode != ShareMemory {
				so.ShareMode = h.mode
			}
		}
		s.Owners = append(s.Owners, so)
	}
	sort.Slice(s.Owners, func(i, j int) bool { return s.Owners[i].Owner < s.Owners[j].Owner })
	for p := range a.n {
		if !a.health[p].Healthy && a.inv.Devices[p].Health.Healthy {
			s.Unhealthy = append(s.Unhealthy, savedHealth{Device: a.saved(p), Reason: a.health[p].Reason})
		}
	}
	s.UnhealthyMIG = a.savedMIGHealth()
	return s
}

func (a *Allocator) saved(p int) savedDevice {
	d := a.inv.Devices[p]
	return savedDevice{Index: d.Index, UUID: d.UUID, BusID: d.BusID}
}

// find maps a saved device to a position: by UUID, else by bus id.
func (a *Allocator) find(d savedDevice) (int, bool) {
	for p, dev := range a.inv.Devices {
		if d.UUID != "" && dev.UUID == d.UUID {
			return p, true
		}
	}
	if d.UUID == "" && d.BusID != "" {
		for p, dev := range a.inv.Devices {
			if dev.BusID == d.BusID {
				return p, true
			}
		}
	}
	return 0, false
}

// restore loads s into an empty allocator. A device no longer in the
// inventory is dropped with a warning; anything contradictory is an error.
func (a *Allocator) restore(s *savedState) error {
	warn := func(format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		a.warnings = append(a.warnings, msg)
		a.cfg.logger.Warn(msg)
	}
	for _, so := range s.Owners {
		h := &holding{group: so.Group, shared: -1, holder: so.Holder}
		for _, d := range so.Devices {
			p, ok := a.find(d)
			if !ok {
				warn("owner %s: gpu %d (%s) is not in the inventory: dropped", so.Owner, d.Index, d.UUID)
				continue
			}
			if a.exclusive[p] != "" || h.devices&(1<<p) != 0 || len(a.shares[p]) > 0 {
				return fmt.Errorf("%s held twice: %w", a.name(p), ErrCorruptState)
			}
			h.devices |= 1 << p
			a.exclusive[p] = so.Owner
		}
		if so.Shared != nil {
			p, ok := a.find(*so.Shared)
			if !ok {
				warn("owner %s: shared gpu %d (%s) is not in the inventory: dropped", so.Owner, so.Shared.Index, so.Shared.UUID)
			} else {
				if a.exclusive[p] != "" {
					return fmt.Errorf("%s both shared and exclusive: %w", a.name(p), ErrCorruptState)
				}
				if a.shares[p] == nil {
					warn("owner %s: %s holds shares but is not configured shareable", so.Owner, a.name(p))
					a.shares[p] = map[string]uint64{}
				}
				mode := so.ShareMode
				if mode == "" {
					mode = ShareMemory
				}
				if m := a.shareMode(p); m != "" && m != mode {
					return fmt.Errorf("%s held by both %s and %s shares: %w", a.name(p), m, mode, ErrCorruptState)
				}
				memory := so.MemoryBytes
				if mode == ShareSlice {
					held, count := a.slicesOn(p)
					if held > 0 && count != so.Slices {
						return fmt.Errorf("%s split in both %d and %d slices: %w", a.name(p), count, so.Slices, ErrCorruptState)
					}
					if held >= so.Slices {
						return fmt.Errorf("%s holds more than %d slices of %d: %w", a.name(p), so.Slices, so.Slices, ErrCorruptState)
					}
					memory = a.sliceMemory(p, so.Slices) // the GPU's part, as this inventory has it
				}
				a.shares[p][so.Owner] = memory
				if a.sharedSum(p) > a.inv.Devices[p].MemoryBytes {
					return fmt.Errorf("%s shares more memory than it has: %w", a.name(p), ErrCorruptState)
				}
				h.shared, h.memory, h.mode, h.compute, h.slices = p, memory, mode, so.ComputePercent, so.Slices
			}
		}
		if so.Shared == nil && len(so.MIG) == 1 && (so.ShareMode != "" || so.MemoryBytes != 0) {
			if err := a.restoreMIGShare(so, h, warn); err != nil {
				return err
			}
		} else if err := a.restoreMIG(so, h, warn); err != nil {
			return err
		}
		if _, migShare := h.migShare(); h.devices == 0 && h.shared < 0 && len(h.mig) == 0 && !migShare {
			continue
		}
		a.owners[so.Owner] = h
	}
	for _, u := range s.Unhealthy {
		if p, ok := a.find(u.Device); ok {
			a.health[p] = node.Unhealthy(u.Reason)
		}
	}
	a.restoreMIGHealth(s.UnhealthyMIG)
	return nil
}

func (a *Allocator) sharedSum(p int) uint64 {
	var s uint64
	for _, m := range a.shares[p] {
		if s+m < s {
			return ^uint64(0)
		}
		s += m
	}
	return s
}

// store keeps the state file of a state directory, and the lock file
// through which processes sharing the directory take turns.
type store struct {
	dir      string
	procRoot string
	lockFile *os.File
	// held counts the Exclusive calls of this allocator in progress: the
	// lock is this allocator's for as long, and its changes do not take it
	// again.
	held int
	// sum is the SHA-256 of the state file as this allocator last read or
	// wrote it; known is false until then, and none says there was no file.
	sum   [sha256.Size]byte
	known bool
	none  bool
}

// LockFile is the name of the lock file in the state directory.
const LockFile = "allocations.lock"

func openStore(dir, procRoot string) (*store, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("state directory %s: %w", dir, err)
	}
	if err := os.MkdirAll(abs, 0o700); err != nil {
		return nil, fmt.Errorf("state directory: %w", err)
	}
	f, err := openLockFile(abs)
	if err != nil {
		return nil, fmt.Errorf("state directory lock: %w", err)
	}
	return &store{dir: abs, procRoot: procRoot, lockFile: f}, nil
}

func (s *store) close() error { return s.lockFile.Close() }

func (s *store) path() string { return filepath.Join(s.dir, StateFile) }

// read returns the state file's bytes: nil, nil when there is none.
func (s *store) read() ([]byte, error) {
	f, err := os.Open(s.path())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read state: %w", err)
	}
	defer f.Close()
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(io.LimitReader(f, maxStateSize+1)); err != nil {
		return nil, fmt.Errorf("read state: %w", err)
	}
	if buf.Len() > maxStateSize {
		return nil, &StateError{File: s.path(), Err: fmt.Errorf("larger than %d bytes: %w", maxStateSize, ErrCorruptState)}
	}
	return buf.Bytes(), nil
}

// changed reads the state file and tells whether it differs from what this
// allocator last saw; st is its decoded content (nil: no file).
func (s *store) changed() (st *savedState, b []byte, changed bool, err error) {
	b, err = s.read()
	if err != nil {
		return nil, nil, false, err
	}
	sum := sha256.Sum256(b)
	if s.known && (b == nil) == s.none && (b == nil || sum == s.sum) {
		return nil, nil, false, nil
	}
	if b != nil {
		if st, err = decodeState(b); err != nil {
			return nil, nil, false, &StateError{File: s.path(), Err: err}
		}
	}
	return st, b, true, nil
}

// seen records b (nil: no file) as the state this allocator holds.
func (s *store) seen(b []byte) {
	s.sum, s.known, s.none = sha256.Sum256(b), true, b == nil
}

// removeStale deletes temporary state files that writers which died
// mid-write left behind. The caller holds the directory's lock, so no live
// process is writing one; a file is still removed only when its writer is
// provably gone.
func (s *store) removeStale() {
	old, err := filepath.Glob(filepath.Join(s.dir, "."+StateFile+".*.tmp"))
	if err != nil {
		return
	}
	self := os.Getpid()
	for _, f := range old {
		rest := strings.TrimPrefix(filepath.Base(f), "."+StateFile+".")
		pidStr, _, ok := strings.Cut(rest, ".")
		pid, err := strconv.Atoi(pidStr)
		if !ok || err != nil || pid <= 0 {
			continue // not a name this package makes
		}
		if pid == self || processGone(s.procRoot, pid) {
			_ = os.Remove(f)
		}
	}
}

// save writes the state atomically (record.Replace): a temporary file in
// the same directory, ".allocations.json.<pid>.<random>.tmp", written and
// synced, renamed over the old one, and the directory synced.
func (s *store) save(st *savedState) error {
	b, err := encodeState(st)
	if err != nil {
		return fmt.Errorf("encode state: %w", err)
	}
	if err := record.Replace(s.path(), b, 0o600); err != nil {
		return fmt.Errorf("write state: %w", err)
	}
	s.seen(b)
	return nil
}
