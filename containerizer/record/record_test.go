package record

import (
	"errors"
	"testing"

	"github.com/gpuiso/gpuiso/record"
)

// TestForwards: a store made through the old path (this package, its
// names unqualified here) is the new package's, and its errors match the
// sentinels of both.
func TestForwards(t *testing.T) {
	s, err := New(t.TempDir(), Options[int]{Format: "f", Version: 1})
	if err != nil {
		t.Fatal(err)
	}
	var _ *record.Store[int] = s
	if err := s.Write(Entry[int]{Key: "k", Phase: Completed, Data: 7}); err != nil {
		t.Fatal(err)
	}
	e, err := s.Read("k")
	if err != nil || e.Data != 7 || e.Phase != record.Completed {
		t.Fatalf("Read = %+v, %v", e, err)
	}
	_, err = s.Read("none")
	if !errors.Is(err, ErrNoRecord) || !errors.Is(err, record.ErrNoRecord) {
		t.Errorf("Read of none = %v", err)
	}
	if err := ValidKey(".k"); !errors.Is(err, ErrInvalidKey) || !errors.Is(err, record.ErrInvalidKey) {
		t.Errorf("ValidKey = %v", err)
	}
}
