package simnode_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/node/simnode"
)

// TestOpenHost: concurrent calls make one tree and see the same majors; a
// tree a killed call left half made (marked as gpuiso's, not whole) is
// made again; Remove takes away all it made and no more; a tree an earlier
// version made (no marker) is read, never written.
func TestOpenHost(t *testing.T) {
	testenv.RequireRoot(t)
	sim, err := simnode.New("dgx1-volta")
	if err != nil {
		t.Fatal(err)
	}
	parent := t.TempDir()
	dir := filepath.Join(parent, "sim", "dgx1-volta")
	ctx := context.Background()
	var wg sync.WaitGroup
	hosts := make([]*simnode.Host, 4)
	errs := make([]error, 4)
	for i := range hosts {
		wg.Go(func() { hosts[i], errs[i] = sim.OpenHost(ctx, dir) })
	}
	wg.Wait()
	for i, h := range hosts {
		if errs[i] != nil || h.NVIDIAMajor == 0 || *h != *hosts[0] {
			t.Fatalf("call %d: %+v, %v; want all equal to %+v", i, h, errs[i], hosts[0])
		}
	}
	// A killed call: not marked whole, a stray file in its dev.
	if err := os.Remove(filepath.Join(dir, simnode.CompleteName)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "dev", "stray"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	h, err := sim.OpenHost(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(h.DevRoot, "stray")); err == nil {
		t.Error("a half-made tree was used as it was, not made again")
	}
	if _, err := os.Stat(filepath.Join(dir, simnode.CompleteName)); err != nil {
		t.Errorf("the remade tree is not marked whole: %v", err)
	}
	// A file of the user's beside the tree stays through Remove.
	if err := os.WriteFile(filepath.Join(dir, "notes.txt"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := h.Remove(); err != nil {
		t.Fatal(err)
	}
	if names := dirNames(dir); !slices.Equal(names, []string{"notes.txt"}) {
		t.Errorf("after Remove the directory holds %v, want only the user's notes.txt", names)
	}
	// Now a directory of the user's: refused.
	if _, err := sim.OpenHost(ctx, dir); !errors.Is(err, simnode.ErrNotOwned) {
		t.Errorf("OpenHost after Remove, with a user's file = %v, want simnode.ErrNotOwned", err)
	}

	// An earlier version's tree: read as it is, never removed.
	legacy := filepath.Join(parent, "legacy")
	made, err := sim.MakeHost(legacy)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(legacy, simnode.MarkerName)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(legacy, simnode.LockName), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := sim.OpenHost(ctx, legacy)
	if err != nil || *got != *made {
		t.Fatalf("OpenHost of an earlier version's tree = %+v, %v; want %+v", got, err, made)
	}
	if err := got.Remove(); !errors.Is(err, simnode.ErrNotOwned) {
		t.Errorf("Remove of an unmarked tree = %v, want simnode.ErrNotOwned", err)
	}
	if _, err := os.Stat(filepath.Join(legacy, "dev", "nvidiactl")); err != nil {
		t.Errorf("an unmarked tree lost its nodes: %v", err)
	}
	if _, err := os.Stat(filepath.Join(legacy, simnode.MarkerName)); err == nil {
		t.Error("an earlier version's tree was marked")
	}
}

func dirNames(dir string) []string {
	list, _ := os.ReadDir(dir)
	var names []string
	for _, e := range list {
		names = append(names, e.Name())
	}
	return names
}
