package record_test

import (
	"errors"
	"testing"

	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/record"
)

// TestParseRefusalIsCorrupt: every content Parse refuses (not JSON, another
// format, a version it does not know, a checksum that does not match) is
// an error matching ErrCorrupt and node.ErrCorrupt, as Read's is.
func TestParseRefusalIsCorrupt(t *testing.T) {
	s, err := record.New(t.TempDir(), record.Options[int]{Format: "f", Version: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{
		"",
		"{",
		"null",
		`{"format":"other","version":1,"key":"k","phase":"started","data":1}`,
		`{"format":"f","version":9,"key":"k","phase":"started","data":1}`,
		`{"format":"f","version":1,"key":"k","phase":"started","data":1,"checksum":"00"}`,
	} {
		if _, err := s.Parse([]byte(b)); !errors.Is(err, record.ErrCorrupt) || !errors.Is(err, node.ErrCorrupt) {
			t.Errorf("Parse(%q): %v, want an ErrCorrupt", b, err)
		}
	}
}
