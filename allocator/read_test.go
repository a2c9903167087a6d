package allocator_test

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
)

// TestReadHoldings: ReadHoldings returns what an allocator with a state
// directory holds, by owner (whole GPUs, a share), while another allocator
// holds the directory's lock (it waits for none), and leaves the state
// file as it was; without a file there are none; a corrupt file is a
// *StateError matching ErrCorruptState; an empty directory name is
// refused.
func TestReadHoldings(t *testing.T) {
	dir := t.TempDir()
	if got, err := allocator.ReadHoldings(dir); got != nil || err != nil {
		t.Fatalf("ReadHoldings without a state file = %v, %v; want none", got, err)
	}
	a := newAlloc(t, "dgx1-volta", allocator.WithShared("7"), allocator.WithStateDir(dir))
	defer a.Close()
	whole := allocOK(t, a, "b-whole", allocator.Request{Count: 2})
	shared := allocOK(t, a, "a-share", allocator.Request{Devices: []string{"7"}, Share: &allocator.Share{MemoryBytes: 1 << 30}})
	file := filepath.Join(dir, allocator.StateFile)
	before, err := os.Stat(file)
	if err != nil {
		t.Fatal(err)
	}
	content, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	holdLock(t, dir)
	listed := dirNames(t, dir)

	got, err := allocator.ReadHoldings(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Owner != "a-share" || got[1].Owner != "b-whole" {
		t.Fatalf("ReadHoldings = %+v; want a-share then b-whole", got)
	}
	var uuids []string
	for _, d := range got[1].Devices {
		uuids = append(uuids, d.UUID)
	}
	var want []string
	for _, d := range whole.Devices {
		want = append(want, d.UUID)
	}
	if !reflect.DeepEqual(uuids, want) || got[1].Shared != nil || got[1].Share != nil {
		t.Errorf("b-whole: %+v; want whole GPUs %v", got[1], want)
	}
	if s := got[0]; s.Shared == nil || s.Shared.UUID != shared.Devices[0].UUID || s.Share == nil || s.Share.MemoryBytes != 1<<30 || len(s.Devices) != 0 {
		t.Errorf("a-share: %+v (shared %+v, share %+v); want 1 GiB of %s", s, s.Shared, s.Share, shared.Devices[0].UUID)
	}
	after, err := os.Stat(file)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := os.ReadFile(file)
	if !after.ModTime().Equal(before.ModTime()) || string(again) != string(content) {
		t.Error("ReadHoldings changed the state file")
	}
	if names := dirNames(t, dir); !reflect.DeepEqual(names, listed) {
		t.Errorf("the state directory held %v, holds %v after ReadHoldings", listed, names)
	}

	corrupt := t.TempDir()
	if err := os.WriteFile(filepath.Join(corrupt, allocator.StateFile), []byte(`{"format":"x"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	var se *allocator.StateError
	if _, err := allocator.ReadHoldings(corrupt); !errors.As(err, &se) || !errors.Is(err, allocator.ErrCorruptState) {
		t.Errorf("ReadHoldings of a corrupt file = %v; want a *StateError matching ErrCorruptState", err)
	}
	if _, err := allocator.ReadHoldings(""); !errors.Is(err, allocator.ErrInvalidRequest) {
		t.Errorf("ReadHoldings(\"\") = %v; want ErrInvalidRequest", err)
	}
}

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}
