package dra

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/gpuiso/gpuiso/record"
)

// legacyCheckpoint is a checkpoint file of versions 1 and 2, written before
// the record store, in its shape as it was (frozen: its checksum is of
// exactly these fields).
type legacyCheckpoint struct {
	Format    string         `json:"format"`
	Version   int            `json:"version"`
	UID       string         `json:"uid"`
	Namespace string         `json:"namespace,omitempty"`
	Name      string         `json:"name,omitempty"`
	State     string         `json:"state"`
	Owner     string         `json:"owner"`
	Devices   []legacyDevice `json:"devices"`
	Share     *legacyShare   `json:"share,omitempty"`
	Checksum  string         `json:"checksum,omitempty"`
}

type legacyDevice struct {
	Requests     []string `json:"requests"`
	Pool         string   `json:"pool"`
	Device       string   `json:"device"`
	UUID         string   `json:"uuid"`
	CDIDeviceIDs []string `json:"cdiDeviceIDs,omitempty"`
	ShareID      string   `json:"shareID,omitempty"`
}

type legacyShare struct {
	MemoryBytes    uint64 `json:"memoryBytes"`
	ComputePercent int    `json:"computePercent,omitempty"`
}

func (c legacyCheckpoint) sum() (string, error) {
	c.Checksum = ""
	b, err := json.Marshal(c)
	if err != nil {
		return "", err
	}
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:]), nil
}

// parseLegacy reads a checkpoint file of version 1 or 2 (a share, then,
// and only then) and checks its checksum and state; the record store
// checks the rest as it checks its own.
func parseLegacy(b []byte) (record.Entry[Checkpoint], error) {
	var c legacyCheckpoint
	if err := json.Unmarshal(b, &c); err != nil {
		return record.Entry[Checkpoint]{}, err
	}
	if c.Format != checkpointFormat || (c.Version != checkpointVersion && c.Version != shareVersion) {
		return record.Entry[Checkpoint]{}, fmt.Errorf("format %q version %d, want %q %d to %d", c.Format, c.Version, checkpointFormat, checkpointVersion, recordVersion)
	}
	if (c.Share != nil) != (c.Version == shareVersion) {
		return record.Entry[Checkpoint]{}, fmt.Errorf("version %d with share %v", c.Version, c.Share)
	}
	sum, err := c.sum()
	if err != nil {
		return record.Entry[Checkpoint]{}, err
	}
	if sum != c.Checksum {
		return record.Entry[Checkpoint]{}, errors.New("checksum mismatch")
	}
	ph, ok := phases[c.State]
	if !ok {
		return record.Entry[Checkpoint]{}, fmt.Errorf("unknown state %q", c.State)
	}
	out := Checkpoint{UID: c.UID, Namespace: c.Namespace, Name: c.Name, State: c.State, Owner: c.Owner}
	for _, d := range c.Devices {
		out.Devices = append(out.Devices, PreparedDevice{Requests: d.Requests, Pool: d.Pool, Device: d.Device, UUID: d.UUID, CDIDeviceIDs: d.CDIDeviceIDs, ShareID: d.ShareID})
	}
	if c.Share != nil {
		out.Share = &PreparedShare{MemoryBytes: c.Share.MemoryBytes, ComputePercent: c.Share.ComputePercent}
	}
	return record.Entry[Checkpoint]{Key: c.UID, Phase: ph, Version: c.Version, Data: out}, nil
}
