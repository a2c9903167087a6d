package record_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/record"
)

// TestZeroStore: a Store not made with New (its zero value, or nil)
// refuses every call with ErrNotMade and writes nothing, into the working
// directory least of all.
func TestZeroStore(t *testing.T) {
	cwd := t.TempDir()
	t.Chdir(cwd)
	for name, s := range map[string]*record.Store[claim]{"zero": {}, "nil": nil} {
		t.Run(name, func(t *testing.T) {
			e := record.Entry[claim]{Key: "k", Phase: record.Started}
			checks := map[string]error{
				"Write":  s.Write(e),
				"Remove": s.Remove("k"),
				"Clean":  s.Clean(),
			}
			_, checks["Read"] = s.Read("k")
			_, checks["Path"] = s.Path("k")
			_, checks["List"] = s.List()
			_, checks["Parse"] = s.Parse([]byte(`{}`))
			for call, err := range checks {
				if !errors.Is(err, record.ErrNotMade) || !errors.Is(err, node.ErrInvalid) {
					t.Errorf("%s = %v, want ErrNotMade", call, err)
				}
			}
			if s.Exists("k") || s.Dir() != "" {
				t.Errorf("Exists = %v, Dir = %q", s.Exists("k"), s.Dir())
			}
		})
	}
	if left, _ := os.ReadDir(cwd); len(left) != 0 {
		t.Fatalf("the working directory holds %d files", len(left))
	}
}

// TestRelativeDir: a store of a relative directory (or "") writes,
// removes and cleans nothing (ErrInvalidOptions) and reads what is there.
func TestRelativeDir(t *testing.T) {
	cwd := t.TempDir()
	t.Chdir(cwd)
	abs := newStore(t, record.Options[claim]{})
	if err := abs.Write(record.Entry[claim]{Key: "k", Phase: record.Completed, Data: claim{Owner: "k"}}); err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(cwd, abs.Dir())
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{"", "records", rel} {
		s, err := record.New(dir, record.Options[claim]{Format: "test-claim", Version: 2})
		if err != nil {
			t.Fatalf("New(%q) = %v", dir, err)
		}
		for call, err := range map[string]error{
			"Write":  s.Write(record.Entry[claim]{Key: "k2", Phase: record.Started}),
			"Remove": s.Remove("k"),
			"Clean":  s.Clean(),
		} {
			if !errors.Is(err, record.ErrInvalidOptions) {
				t.Errorf("store %q: %s = %v, want ErrInvalidOptions", dir, call, err)
			}
		}
	}
	s, _ := record.New(rel, record.Options[claim]{Format: "test-claim", Version: 2})
	if e, err := s.Read("k"); err != nil || e.Data.Owner != "k" {
		t.Fatalf("Read through the relative store = %+v, %v", e, err)
	}
	if entries, _ := os.ReadDir(cwd); len(entries) != 0 {
		t.Fatalf("the working directory holds %d entries", len(entries))
	}
	if !abs.Exists("k") {
		t.Fatal("a refused Remove removed the entry")
	}
}

// TestMissingDir: a write into a directory that does not exist, and a
// List of one, match node.ErrNotFound (and no other kind).
func TestMissingDir(t *testing.T) {
	kinds := []error{node.ErrNotSupported, node.ErrInvalid, node.ErrExists, node.ErrNotFound, node.ErrInsufficient, node.ErrUnavailable, node.ErrCorrupt}
	missing := filepath.Join(t.TempDir(), "missing")
	flat, err := record.New(missing, record.Options[claim]{Format: "f", Version: 1})
	if err != nil {
		t.Fatal(err)
	}
	nested, err := record.New(t.TempDir(), record.Options[claim]{Format: "f", Version: 1, Name: "c.json"})
	if err != nil {
		t.Fatal(err)
	}
	e := record.Entry[claim]{Key: "k", Phase: record.Started}
	_, listErr := flat.List()
	for call, err := range map[string]error{"Write": flat.Write(e), "Write of a key without its directory": nested.Write(e), "List": listErr} {
		n := 0
		for _, k := range kinds {
			if errors.Is(err, k) {
				n++
			}
		}
		if !errors.Is(err, node.ErrNotFound) || n != 1 {
			t.Errorf("%s = %v, want node.ErrNotFound alone", call, err)
		}
	}
	if _, err := os.Stat(missing); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the missing directory: %v", err)
	}
}
