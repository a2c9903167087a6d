package cdi_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/isolator/cdi"
	"github.com/gpuiso/gpuiso/node"
)

// TestRelativeDir: a Writer whose Dir is not absolute refuses every call
// that names a file (ErrInvalidDir, of kind node.ErrInvalid) and writes
// nothing into the working directory.
func TestRelativeDir(t *testing.T) {
	cwd := t.TempDir()
	t.Chdir(cwd)
	spec, err := cdi.New(simInv(t, "dgx1-volta"))
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{"relative", "./cdi", "."} {
		w := cdi.Writer{Dir: dir}
		_, pathErr := w.Path(cdi.DefaultKind)
		_, writeErr := w.Write(t.Context(), spec)
		_, allocErr := w.WriteAllocation(t.Context(), "c1", spec)
		for call, err := range map[string]error{
			"Path":             pathErr,
			"Write":            writeErr,
			"WriteAllocation":  allocErr,
			"Remove":           w.Remove(t.Context(), cdi.DefaultKind),
			"RemoveAllocation": w.RemoveAllocation(t.Context(), cdi.DefaultKind, "c1"),
			"Sweep":            w.Sweep(t.Context()),
		} {
			if !errors.Is(err, cdi.ErrInvalidDir) || !errors.Is(err, node.ErrInvalid) {
				t.Errorf("Dir %q: %s = %v, want ErrInvalidDir", dir, call, err)
			}
		}
	}
	if left, _ := os.ReadDir(cwd); len(left) != 0 {
		t.Fatalf("the working directory holds %d entries", len(left))
	}
}

// TestSweep: the temporary files that writers killed in the middle of a
// write left (their process gone, or another process under their pid)
// are removed by Sweep and by the next write that changes a file; a live
// writer's, one that names no start time, and files that are not
// temporary spec files stay.
func TestSweep(t *testing.T) {
	self, err := linux.Self("/proc")
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	w := cdi.Writer{Dir: t.TempDir()}
	inv := simInv(t, "dgx1-volta")
	spec, err := cdi.New(inv)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(t.Context(), spec); err != nil {
		t.Fatal(err)
	}
	file := "nvidia.com-gpu.json"
	dead := []string{
		fmt.Sprintf(".%s.%d.%d.123.tmp", file, self.Pid, self.Start+1), // another process under this pid
		fmt.Sprintf(".%s.%d.%d.456.tmp", file, 1<<30, self.Start),      // a pid no process has
		fmt.Sprintf(".nvidia.com-gpu_alloc-c1.json.%d.%d.7.tmp", 1<<30, 1),
		"." + file + ".3141592653.tmp", // an earlier version's
	}
	kept := []string{
		file,
		fmt.Sprintf(".%s.%s.789.tmp", file, self),  // a live writer's
		fmt.Sprintf(".%s.%d.0.1.tmp", file, 1<<30), // no start time: never provably dead
		".other.tmp",
		"notes.json.1.tmp",
		fmt.Sprintf(".%s.x.1.2.tmp", file),
	}
	plant := func() {
		t.Helper()
		for _, n := range dead {
			if err := os.WriteFile(filepath.Join(w.Dir, n), []byte("{"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		for _, n := range kept[1:] {
			if err := os.WriteFile(filepath.Join(w.Dir, n), []byte("{"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	check := func(after string) {
		t.Helper()
		entries, err := os.ReadDir(w.Dir)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		want := slices.Clone(kept)
		slices.Sort(want)
		if !slices.Equal(names, want) {
			t.Fatalf("after %s the directory holds %q, want %q", after, names, want)
		}
	}

	plant()
	if err := w.Sweep(t.Context()); err != nil {
		t.Fatal(err)
	}
	check("Sweep")

	// An unchanged write touches nothing; a changed one sweeps.
	plant()
	inv.Devices[1].Health = node.Unhealthy("XID 79")
	changed, err := cdi.New(inv)
	if err != nil {
		t.Fatal(err)
	}
	if res, err := w.Write(t.Context(), changed); err != nil || !res.Changed {
		t.Fatalf("Write = %+v, %v", res, err)
	}
	check("a changed write")

	if err := (cdi.Writer{Dir: filepath.Join(w.Dir, "missing")}).Sweep(t.Context()); err != nil {
		t.Fatalf("Sweep of a missing directory = %v", err)
	}
}
