package record_test

import (
	"errors"
	"testing"

	old "github.com/gpuiso/gpuiso/containerizer/record"
	"github.com/gpuiso/gpuiso/record"
)

// TestForwards: a store made through the old path is the new package's,
// and its errors match the sentinels of both.
func TestForwards(t *testing.T) {
	s, err := old.New(t.TempDir(), old.Options[int]{Format: "f", Version: 1})
	if err != nil {
		t.Fatal(err)
	}
	var _ *record.Store[int] = s
	if err := s.Write(old.Entry[int]{Key: "k", Phase: old.Completed, Data: 7}); err != nil {
		t.Fatal(err)
	}
	e, err := s.Read("k")
	if err != nil || e.Data != 7 || e.Phase != record.Completed {
		t.Fatalf("Read = %+v, %v", e, err)
	}
	_, err = s.Read("none")
	if !errors.Is(err, old.ErrNoRecord) || !errors.Is(err, record.ErrNoRecord) {
		t.Errorf("Read of none = %v", err)
	}
	if err := old.ValidKey(".k"); !errors.Is(err, old.ErrInvalidKey) || !errors.Is(err, record.ErrInvalidKey) {
		t.Errorf("ValidKey = %v", err)
	}
}
