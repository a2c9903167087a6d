package record_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/record"
)

func newFile(t *testing.T, o record.Options[claim]) *record.File[claim] {
	t.Helper()
	o.Format, o.Version = "test-claim", 2
	f, err := record.NewFile(filepath.Join(t.TempDir(), "state.json"), "state", o)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestFileRoundTrip: a File's entry reads back with the file's key, in
// the file's mode, through a path or a handle on its directory, synced or
// not, and leaves no temporary file.
func TestFileRoundTrip(t *testing.T) {
	for name, o := range map[string]record.Options[claim]{
		"synced":     {},
		"not synced": {NoSync: true},
		"mode 0644":  {Perm: 0o644},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFile(t, o)
			if _, err := f.Read(); !errors.Is(err, record.ErrNoRecord) || f.Exists() {
				t.Fatalf("Read of no file = %v, exists %v", err, f.Exists())
			}
			if err := f.Write(record.Entry[claim]{Phase: record.Completed, Data: claim{Owner: "a"}}); err != nil {
				t.Fatal(err)
			}
			e, err := f.Read()
			if err != nil || e.Key != "state" || e.Data.Owner != "a" || e.Version != 2 {
				t.Fatalf("Read = %+v, %v", e, err)
			}
			dir, err := os.OpenRoot(filepath.Dir(f.Path()))
			if err != nil {
				t.Fatal(err)
			}
			defer dir.Close()
			if err := f.WriteIn(dir, record.Entry[claim]{Key: "state", Phase: record.Started, Data: claim{Owner: "b"}}); err != nil {
				t.Fatal(err)
			}
			if e, err := f.Read(); err != nil || e.Phase != record.Started || e.Data.Owner != "b" {
				t.Fatalf("Read after WriteIn = %+v, %v", e, err)
			}
			want := o.Perm
			if want == 0 {
				want = 0o600
			}
			if fi, err := os.Stat(f.Path()); err != nil || fi.Mode().Perm() != want {
				t.Errorf("file %v, %v; want mode %v", fi, err, want)
			}
			left, _ := os.ReadDir(filepath.Dir(f.Path()))
			if len(left) != 1 {
				t.Errorf("the directory holds %d files, want 1", len(left))
			}
			if err := f.Remove(); err != nil || f.Exists() {
				t.Fatalf("Remove = %v, exists %v", err, f.Exists())
			}
		})
	}
}

// TestFileRefuses: an entry of another key, or bytes that are no entry of
// the file, are refused and write nothing; a file of another key reads as
// corrupt.
func TestFileRefuses(t *testing.T) {
	f := newFile(t, record.Options[claim]{})
	if err := f.Write(record.Entry[claim]{Key: "other", Phase: record.Completed}); !errors.Is(err, record.ErrInvalidEntry) || !errors.Is(err, node.ErrInvalid) {
		t.Errorf("Write of another key = %v", err)
	}
	for name, b := range map[string]string{
		"not JSON":  "{",
		"no entry":  `{"owner":"x"}`,
		"other key": `{"format":"test-claim","version":2,"key":"other","phase":"completed","data":{}}`,
	} {
		if err := f.Replace([]byte(b)); !errors.Is(err, record.ErrInvalidEntry) {
			t.Errorf("Replace(%s) = %v", name, err)
		}
	}
	if f.Exists() {
		t.Fatal("a refused write left a file")
	}
	g, err := record.NewFile(filepath.Join(filepath.Dir(f.Path()), "other.json"), "other", record.Options[claim]{Format: "test-claim", Version: 2})
	if err != nil {
		t.Fatal(err)
	}
	b, err := g.Encode(record.Entry[claim]{Phase: record.Completed})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f.Path(), b, 0o600); err != nil {
		t.Fatal(err)
	}
	var ce *record.CorruptError
	if _, err := f.Read(); !errors.As(err, &ce) || !errors.Is(err, node.ErrCorrupt) {
		t.Errorf("Read of another key's file = %v", err)
	}
	if _, err := f.Decode(b); !errors.Is(err, record.ErrCorrupt) {
		t.Errorf("Decode of another key's file = %v", err)
	}
	for name, mk := range map[string]func() error{
		"Name": func() error {
			_, err := record.NewFile("/x/f", "k", record.Options[claim]{Format: "f", Version: 1, Name: "n"})
			return err
		},
		"no name": func() error {
			_, err := record.NewFile("/x/", "k", record.Options[claim]{Format: "f", Version: 1})
			return err
		},
		"bad key": func() error {
			_, err := record.NewFile("/x/f", ".k", record.Options[claim]{Format: "f", Version: 1})
			return err
		},
		"no codec": func() error { _, err := record.NewCodec(record.Options[claim]{Version: 1}); return err },
	} {
		if err := mk(); !errors.Is(err, node.ErrInvalid) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestFileTemp: Clean removes what writes cut short left, nothing else;
// a write that fails leaves no temporary file.
func TestFileTemp(t *testing.T) {
	f := newFile(t, record.Options[claim]{})
	dir := filepath.Dir(f.Path())
	for _, n := range []string{".state.json.1.2.tmp", ".state.json.7.tmp", "keep.json"} {
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Clean(); err != nil {
		t.Fatal(err)
	}
	left, _ := os.ReadDir(dir)
	if len(left) != 1 || left[0].Name() != "keep.json" {
		t.Fatalf("left %v", left)
	}
	// A write whose directory refuses the rename leaves nothing behind.
	if err := os.Mkdir(f.Path(), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(f.Path(), "x"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := f.Write(record.Entry[claim]{Phase: record.Completed}); err == nil {
		t.Fatal("a write over a directory succeeded")
	}
	for _, e := range mustReadDir(t, dir) {
		if strings.HasSuffix(e, ".tmp") {
			t.Errorf("left %s", e)
		}
	}
}

func mustReadDir(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out
}

// TestLegacyWithoutKey: a Legacy reader of an old shape that held no key
// gives the key of the file read (Store.Read, File.Read, File.Decode);
// where no file's key is known (Codec.Decode) such content is corrupt.
func TestLegacyWithoutKey(t *testing.T) {
	legacy := func(b []byte) (record.Entry[claim], error) {
		return record.Entry[claim]{Phase: record.Completed, Version: 1, Data: claim{Owner: string(b)}}, nil
	}
	o := record.Options[claim]{Format: "test-claim", Version: 2, Legacy: legacy}
	s, err := record.New(t.TempDir(), o)
	if err != nil {
		t.Fatal(err)
	}
	p, _ := s.Path("k")
	if err := os.WriteFile(p, []byte(`{"owner":"old"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if e, err := s.Read("k"); err != nil || e.Key != "k" || e.Version != 1 {
		t.Errorf("Store.Read = %+v, %v", e, err)
	}
	f, err := record.NewFile(p, "k", o)
	if err != nil {
		t.Fatal(err)
	}
	if e, err := f.Read(); err != nil || e.Key != "k" {
		t.Errorf("File.Read = %+v, %v", e, err)
	}
	if e, err := f.Decode([]byte(`{"owner":"old"}`)); err != nil || e.Key != "k" {
		t.Errorf("File.Decode = %+v, %v", e, err)
	}
	c, err := f.Codec()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Decode([]byte(`{"owner":"old"}`)); !errors.Is(err, record.ErrCorrupt) {
		t.Errorf("Codec.Decode = %v", err)
	}
}
