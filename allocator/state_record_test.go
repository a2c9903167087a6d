package allocator_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/record"
)

// stateV1 is the committed state file of version 1 (the allocator's own
// envelope), and its state's JSON.
func stateV1(t *testing.T) (file []byte, state json.RawMessage) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "state-v1.json"))
	if err != nil {
		t.Fatal(err)
	}
	var env struct {
		State json.RawMessage `json:"state"`
	}
	if err := json.Unmarshal(b, &env); err != nil {
		t.Fatal(err)
	}
	return b, env.State
}

// stateEntry is state as a record entry of the allocator's state format.
func stateEntry(t *testing.T, key string, state json.RawMessage) []byte {
	t.Helper()
	c, err := record.NewCodec(record.Options[json.RawMessage]{Format: "gpuiso-allocator-state", Version: 2})
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.Encode(record.Entry[json.RawMessage]{Key: key, Phase: record.Completed, Data: state})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestStateFormats: the committed state file of version 1 restores the
// allocations it records, and so does the same state as a record entry
// (version 2, which a later release writes); either way the next change
// is written in version 1, which every earlier release reads.
func TestStateFormats(t *testing.T) {
	old, state := stateV1(t)
	for name, b := range map[string][]byte{
		"version 1":                old,
		"version 2 (record entry)": stateEntry(t, "allocations", state),
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, allocator.StateFile)
			if err := os.WriteFile(path, b, 0o600); err != nil {
				t.Fatal(err)
			}
			a, err := allocator.New(simInv(t, "dgx1-volta"), allocator.WithStateDir(dir), allocator.WithShared("7"))
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			al, err := a.Allocation("a")
			sh, serr := a.Allocation("s")
			if err != nil || serr != nil || len(al.Devices) != 2 || al.Group != "g" || sh.Share == nil || sh.Share.MemoryBytes != 1<<30 {
				t.Fatalf("restored %+v, %+v (%v, %v)", al, sh, err, serr)
			}
			allocOK(t, a, "b", allocator.Request{Count: 1})
			again, err := os.ReadFile(path)
			if err != nil || !strings.HasPrefix(string(again), `{"format":"gpuiso.allocator.state","version":1,`) {
				t.Fatalf("written as %s (%v)", again, err)
			}
		})
	}
}

// TestStateEntryRefused: a record entry of the state format that is not
// the allocator's state (another key, a field the state does not have, a
// broken checksum) is corrupt state, as a bad file of version 1 is.
func TestStateEntryRefused(t *testing.T) {
	_, state := stateV1(t)
	unknown := json.RawMessage(strings.Replace(string(state), `"owners"`, `"other":1,"owners"`, 1))
	broken := strings.Replace(string(stateEntry(t, "allocations", state)), `"owner":"a"`, `"owner":"b"`, 1)
	for name, b := range map[string]string{
		"another key":   string(stateEntry(t, "other", state)),
		"unknown field": string(stateEntry(t, "allocations", unknown)),
		"checksum":      broken,
	} {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, allocator.StateFile), []byte(b), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := allocator.New(simInv(t, "dgx1-volta"), allocator.WithStateDir(dir), allocator.WithShared("7")); !errors.Is(err, allocator.ErrCorruptState) {
			t.Errorf("%s: New = %v, want ErrCorruptState", name, err)
		}
	}
}
