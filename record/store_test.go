package record_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/record"
)

type claim struct {
	Owner string   `json:"owner"`
	GPUs  []string `json:"gpus,omitempty"`
}

func newStore(t *testing.T, o record.Options[claim]) *record.Store[claim] {
	t.Helper()
	if o.Format == "" {
		o.Format, o.Version = "test-claim", 2
	}
	s, err := record.New(t.TempDir(), o)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestRoundTrip: what is written reads back, phase, process and data,
// in the store's version; a second write replaces the first and leaves no
// temporary file.
func TestRoundTrip(t *testing.T) {
	for name, o := range map[string]record.Options[claim]{
		"synced":      {},
		"not synced":  {NoSync: true},
		"nested":      {Name: "container.json"},
		"nested fast": {Name: "container.json", NoSync: true},
	} {
		t.Run(name, func(t *testing.T) {
			s := newStore(t, o)
			if o.Name != "" {
				if err := os.Mkdir(filepath.Join(s.Dir(), "c1"), 0o700); err != nil {
					t.Fatal(err)
				}
			}
			proc := &node.Process{Pid: 42, Start: 4242}
			if err := s.Write(record.Entry[claim]{Key: "c1", Phase: record.Started, Data: claim{Owner: "c1"}}); err != nil {
				t.Fatal(err)
			}
			want := record.Entry[claim]{Key: "c1", Phase: record.Completed, Process: proc, Version: 2, Data: claim{Owner: "c1", GPUs: []string{"GPU-a"}}}
			if err := s.Write(want); err != nil {
				t.Fatal(err)
			}
			got, err := s.Read("c1")
			if err != nil {
				t.Fatal(err)
			}
			if got.Key != want.Key || got.Phase != want.Phase || *got.Process != *proc || got.Version != 2 || got.Data.Owner != "c1" || len(got.Data.GPUs) != 1 {
				t.Fatalf("read %+v, want %+v", got, want)
			}
			keys, err := s.List()
			if err != nil || len(keys) != 1 || keys[0] != "c1" {
				t.Fatalf("List = %v, %v", keys, err)
			}
			p, _ := s.Path("c1")
			left, _ := os.ReadDir(filepath.Dir(p))
			for _, e := range left {
				if strings.HasSuffix(e.Name(), ".tmp") {
					t.Errorf("left %s", e.Name())
				}
			}
			if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o600 {
				t.Errorf("file %v, %v; want mode 0600", fi, err)
			}
			if err := s.Remove("c1"); err != nil || s.Exists("c1") {
				t.Fatalf("Remove: %v, exists %v", err, s.Exists("c1"))
			}
			if err := s.Remove("c1"); err != nil {
				t.Fatalf("Remove of a removed key: %v", err)
			}
		})
	}
}

// TestMissing: a key without a file is ErrNoRecord, a kind of
// node.ErrNotFound.
func TestMissing(t *testing.T) {
	s := newStore(t, record.Options[claim]{})
	_, err := s.Read("none")
	if !errors.Is(err, record.ErrNoRecord) || !errors.Is(err, node.ErrNotFound) {
		t.Fatalf("Read = %v", err)
	}
	if s.Exists("none") {
		t.Error("Exists")
	}
}

// TestCorrupt: every way a file can be untrustworthy is a *CorruptError
// matching ErrCorrupt and node.ErrCorrupt, never a zero entry.
func TestCorrupt(t *testing.T) {
	s := newStore(t, record.Options[claim]{})
	if err := s.Write(record.Entry[claim]{Key: "c", Phase: record.Completed, Data: claim{Owner: "c"}}); err != nil {
		t.Fatal(err)
	}
	p, _ := s.Path("c")
	good, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	edit := func(f func(m map[string]any)) []byte {
		var m map[string]any
		if err := json.Unmarshal(good, &m); err != nil {
			t.Fatal(err)
		}
		f(m)
		b, _ := json.Marshal(m)
		return b
	}
	for name, b := range map[string][]byte{
		"empty":          {},
		"truncated":      good[:len(good)/2],
		"not an object":  []byte(`[1]`),
		"data changed":   edit(func(m map[string]any) { m["data"].(map[string]any)["owner"] = "other" }),
		"phase changed":  edit(func(m map[string]any) { m["phase"] = "started" }),
		"no checksum":    edit(func(m map[string]any) { delete(m, "checksum") }),
		"other format":   edit(func(m map[string]any) { m["format"] = "other" }),
		"newer version":  edit(func(m map[string]any) { m["version"] = 3 }),
		"version 0":      edit(func(m map[string]any) { m["version"] = 0 }),
		"no data":        edit(func(m map[string]any) { delete(m, "data") }),
		"data not typed": edit(func(m map[string]any) { m["data"] = "x" }),
	} {
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		e, err := s.Read("c")
		var ce *record.CorruptError
		if !errors.Is(err, record.ErrCorrupt) || !errors.Is(err, node.ErrCorrupt) || !errors.As(err, &ce) || ce.Path != p {
			t.Errorf("%s: Read = %+v, %v", name, e, err)
		}
	}
	// A file of another key, moved: its checksum holds, its key does not.
	if err := os.WriteFile(p, good, 0o600); err != nil {
		t.Fatal(err)
	}
	other, _ := s.Path("d")
	if err := os.Rename(p, other); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Read("d"); !errors.Is(err, record.ErrCorrupt) {
		t.Errorf("a moved file: %v", err)
	}
}

// TestInvalid: bad keys, phases, processes and options are refused with
// their kind, and nothing is written.
func TestInvalid(t *testing.T) {
	s := newStore(t, record.Options[claim]{})
	for _, key := range []string{"", ".", "..", ".hidden", "a/b", `a\b`, "a\x00b", strings.Repeat("k", record.MaxKeyLen+1)} {
		if err := s.Write(record.Entry[claim]{Key: key, Phase: record.Started}); !errors.Is(err, record.ErrInvalidKey) || !errors.Is(err, node.ErrInvalid) {
			t.Errorf("key %q: %v", key, err)
		}
		if _, err := s.Read(key); !errors.Is(err, record.ErrInvalidKey) {
			t.Errorf("read key %q: %v", key, err)
		}
	}
	for name, e := range map[string]record.Entry[claim]{
		"no phase":      {Key: "k"},
		"unknown phase": {Key: "k", Phase: "done"},
		"no start":      {Key: "k", Phase: record.Started, Process: &node.Process{Pid: 1}},
	} {
		if err := s.Write(e); !errors.Is(err, record.ErrInvalidEntry) || !errors.Is(err, node.ErrInvalid) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if left, _ := os.ReadDir(s.Dir()); len(left) != 0 {
		t.Errorf("left %d files", len(left))
	}
	for name, o := range map[string]record.Options[claim]{
		"no format": {Version: 1},
		"version 0": {Format: "f"},
		"bad name":  {Format: "f", Version: 1, Name: "a/b"},
		"NUL name":  {Format: "f", Version: 1, Name: "a\x00b"},
		"long name": {Format: "f", Version: 1, Name: strings.Repeat("n", record.MaxKeyLen+1)},
	} {
		if _, err := record.New(t.TempDir(), o); !errors.Is(err, record.ErrInvalidOptions) || !errors.Is(err, node.ErrInvalid) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestLegacy: with Options.Legacy, a file of the user's old shape reads as
// the entry it means, and the next write is in the store's format; without
// it the same file is corrupt.
func TestLegacy(t *testing.T) {
	old := []byte(`{"version":1,"id":"c","phase":"prepared","gpus":["GPU-a"]}`)
	legacy := func(b []byte) (record.Entry[claim], error) {
		var o struct {
			Version int      `json:"version"`
			ID      string   `json:"id"`
			Phase   string   `json:"phase"`
			GPUs    []string `json:"gpus"`
		}
		if err := json.Unmarshal(b, &o); err != nil {
			return record.Entry[claim]{}, err
		}
		if o.Version != 1 || o.Phase != "prepared" {
			return record.Entry[claim]{}, errors.New("not a version 1 record")
		}
		return record.Entry[claim]{Key: o.ID, Phase: record.Completed, Version: 1, Data: claim{Owner: o.ID, GPUs: o.GPUs}}, nil
	}
	s := newStore(t, record.Options[claim]{Format: "test-claim", Version: 2, Legacy: legacy})
	p, _ := s.Path("c")
	if err := os.WriteFile(p, old, 0o600); err != nil {
		t.Fatal(err)
	}
	e, err := s.Read("c")
	if err != nil || e.Phase != record.Completed || e.Version != 1 || e.Data.GPUs[0] != "GPU-a" {
		t.Fatalf("Read = %+v, %v", e, err)
	}
	if err := s.Write(e); err != nil {
		t.Fatal(err)
	}
	if e, err := s.Read("c"); err != nil || e.Version != 2 {
		t.Fatalf("Read after a write = %+v, %v", e, err)
	}
	strict, err := record.New(s.Dir(), record.Options[claim]{Format: "test-claim", Version: 2})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, old, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := strict.Read("c"); !errors.Is(err, record.ErrCorrupt) {
		t.Fatalf("without Legacy: %v", err)
	}
	// A legacy file naming another key is refused as the store's are.
	if err := os.WriteFile(p, []byte(`{"version":1,"id":"d","phase":"prepared"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Read("c"); !errors.Is(err, record.ErrCorrupt) {
		t.Fatalf("a legacy file of another key: %v", err)
	}
}

// TestListAndClean: List names the keys that have a file and nothing
// else; Clean removes the temporary files of cut-short writes and nothing
// else.
func TestListAndClean(t *testing.T) {
	s := newStore(t, record.Options[claim]{})
	for _, k := range []string{"b", "a"} {
		if err := s.Write(record.Entry[claim]{Key: k, Phase: record.Started}); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range []string{".a.json.123.tmp", ".b.json.9.tmp", ".lock", "notes.txt"} {
		if err := os.WriteFile(filepath.Join(s.Dir(), n), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(s.Dir(), "dir.json"), 0o700); err != nil {
		t.Fatal(err)
	}
	keys, err := s.List()
	if err != nil || strings.Join(keys, ",") != "a,b" {
		t.Fatalf("List = %v, %v", keys, err)
	}
	if err := s.Clean(); err != nil {
		t.Fatal(err)
	}
	var left []string
	entries, _ := os.ReadDir(s.Dir())
	for _, e := range entries {
		left = append(left, e.Name())
	}
	if strings.Join(left, ",") != ".lock,a.json,b.json,dir.json,notes.txt" {
		t.Fatalf("left %v", left)
	}

	n := newStore(t, record.Options[claim]{Name: "container.json"})
	for _, d := range []string{"x", "y", ".new-z.1.2"} {
		if err := os.Mkdir(filepath.Join(n.Dir(), d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := n.Write(record.Entry[claim]{Key: "y", Phase: record.Completed}); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(n.Dir(), "y", ".container.json.77.tmp")
	if err := os.WriteFile(tmp, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if keys, err := n.List(); err != nil || strings.Join(keys, ",") != "y" {
		t.Fatalf("nested List = %v, %v", keys, err)
	}
	if err := n.Clean(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(tmp); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("nested Clean left %s: %v", tmp, err)
	}
}

// FuzzParse: any bytes give an entry or an error, never a panic, and an
// accepted entry has a known phase, a valid key and a version the store
// knows.
func FuzzParse(f *testing.F) {
	s, err := record.New("/nonexistent", record.Options[claim]{Format: "test-claim", Version: 2})
	if err != nil {
		f.Fatal(err)
	}
	good, _ := os.ReadFile(filepath.Join("testdata", "claim.json"))
	f.Add(good)
	f.Add([]byte("{"))
	f.Add([]byte(`{"format":"test-claim","version":1,"key":"k","phase":"started","data":{}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := s.Parse(b)
		if err != nil {
			if !errors.Is(err, record.ErrCorrupt) || !errors.Is(err, node.ErrCorrupt) {
				t.Errorf("refused with %v, not an ErrCorrupt", err)
			}
			return
		}
		if (e.Phase != record.Started && e.Phase != record.Completed) || record.ValidKey(e.Key) != nil || e.Version < 1 || e.Version > 2 {
			t.Errorf("accepted %+v", e)
		}
	})
}

// TestTestdata: the checked-in file, of the store's format, reads back
// as what it says (its checksum computed as the store computes it).
func TestTestdata(t *testing.T) {
	s, err := record.New("testdata", record.Options[claim]{Format: "test-claim", Version: 2})
	if err != nil {
		t.Fatal(err)
	}
	e, err := s.Read("claim")
	if err != nil || e.Phase != record.Completed || e.Process == nil || e.Process.Pid != 7 || e.Data.Owner != "claim" {
		t.Fatalf("Read = %+v, %v", e, err)
	}
}

// TestLongestKey: a key of MaxKeyLen bytes is written, read and removed,
// its temporary file's name within the file system's limit.
func TestLongestKey(t *testing.T) {
	for _, name := range []string{"", strings.Repeat("n", record.MaxKeyLen)} {
		s := newStore(t, record.Options[claim]{Name: name})
		key := strings.Repeat("k", record.MaxKeyLen)
		if name != "" {
			if err := os.Mkdir(filepath.Join(s.Dir(), key), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.Write(record.Entry[claim]{Key: key, Phase: record.Started}); err != nil {
			t.Fatalf("name %d bytes: %v", len(name), err)
		}
		if _, err := s.Read(key); err != nil {
			t.Fatalf("name %d bytes: %v", len(name), err)
		}
	}
}
