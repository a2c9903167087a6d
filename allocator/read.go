package allocator

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// SavedDevice names a GPU as a state file records it: by UUID and PCI bus
// id, which stay the same across restarts; Index is NVML's index when the
// state was saved, and only informative.
type SavedDevice struct {
	Index int
	UUID  string
	BusID string
}

// Holding is what one owner holds, as a state file records it. Exactly one
// of Devices, Shared and MIG is set.
type Holding struct {
	Owner string
	Group string
	// Devices are the whole GPUs held.
	Devices []SavedDevice
	// Shared is the GPU of the share held, Share the share.
	Shared *SavedDevice
	Share  *Share
	// MIG are the "MIG-" UUIDs of the MIG devices held.
	MIG []string
	// Holder is the process the holding was recorded for, if any.
	Holder *Holder
}

// ReadHoldings reads what the state file in the state directory dir
// records each owner as holding, by owner. It is a read-only look, for
// tools and tests that watch a directory other processes allocate from:
// it opens no allocator, takes and waits for no lock, and changes nothing
// (no file is written, none removed). Writers replace the state file
// whole, so what it returns is one complete save; it may be out of date
// as soon as it returns. Without a state file there are no holdings and no
// error. A state file that cannot be decoded is a *StateError matching
// ErrCorruptState; an empty dir is an ErrInvalidRequest.
func ReadHoldings(dir string) ([]Holding, error) {
	if dir == "" {
		return nil, fmt.Errorf("read holdings: empty state directory: %w", ErrInvalidRequest)
	}
	file := filepath.Join(dir, StateFile)
	f, err := os.Open(file)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read holdings: %w", err)
	}
	defer f.Close()
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(io.LimitReader(f, maxStateSize+1)); err != nil {
		return nil, fmt.Errorf("read holdings: %w", err)
	}
	if buf.Len() > maxStateSize {
		return nil, &StateError{File: file, Err: fmt.Errorf("larger than %d bytes: %w", maxStateSize, ErrCorruptState)}
	}
	st, err := decodeState(buf.Bytes())
	if err != nil {
		return nil, &StateError{File: file, Err: err}
	}
	out := make([]Holding, 0, len(st.Owners))
	for _, o := range st.Owners {
		h := Holding{Owner: o.Owner, Group: o.Group}
		for _, d := range o.Devices {
			h.Devices = append(h.Devices, SavedDevice(d))
		}
		if o.Shared != nil {
			d := SavedDevice(*o.Shared)
			h.Shared = &d
			h.Share = &Share{Mode: o.ShareMode, MemoryBytes: o.MemoryBytes, ComputePercent: o.ComputePercent, Slices: o.Slices}
		}
		for _, m := range o.MIG {
			h.MIG = append(h.MIG, m.UUID)
		}
		if o.Holder != nil {
			holder := *o.Holder
			h.Holder = &holder
		}
		out = append(out, h)
	}
	slices.SortFunc(out, func(a, b Holding) int { return strings.Compare(a.Owner, b.Owner) })
	return out, nil
}
