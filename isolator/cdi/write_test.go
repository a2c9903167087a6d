package cdi_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/isolator/cdi"
	"github.com/gpuiso/gpuiso/node"
)

func TestWriteIdempotent(t *testing.T) {
	dir := t.TempDir()
	w := cdi.Writer{Dir: filepath.Join(dir, "cdi")} // created on first write
	spec, err := cdi.New(simInv(t, "dgx1-volta"))
	if err != nil {
		t.Fatal(err)
	}
	res, err := w.Write(t.Context(), spec)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Changed || res.Path != filepath.Join(dir, "cdi", "nvidia.com-gpu.json") {
		t.Fatalf("first write: %+v", res)
	}
	// Age the file, so an unwanted rewrite cannot hide in the clock's
	// resolution.
	past := time.Now().Add(-time.Hour).Truncate(time.Second)
	if err := os.Chtimes(res.Path, past, past); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(res.Path)

	again, err := cdi.New(simInv(t, "dgx1-volta")) // a second generator run
	if err != nil {
		t.Fatal(err)
	}
	res2, err := w.Write(t.Context(), again)
	if err != nil {
		t.Fatal(err)
	}
	if res2.Changed {
		t.Error("second write of an unchanged node changed the file")
	}
	after, _ := os.ReadFile(res.Path)
	fi, err := os.Stat(res.Path)
	if err != nil {
		t.Fatal(err)
	}
	if string(after) != string(before) || !fi.ModTime().Equal(past) {
		t.Errorf("file touched: mtime %v, want %v", fi.ModTime(), past)
	}
	if fi.Mode().Perm() != 0o644 {
		t.Errorf("mode %v, want 0644", fi.Mode())
	}
	entries, _ := os.ReadDir(w.Dir)
	if len(entries) != 1 {
		t.Errorf("spec dir holds %d entries, want the spec alone", len(entries))
	}
}

func TestWriteOnHealthChange(t *testing.T) {
	w := cdi.Writer{Dir: t.TempDir()}
	inv := simInv(t, "dgx1-volta")
	spec, _ := cdi.New(inv)
	if _, err := w.Write(t.Context(), spec); err != nil {
		t.Fatal(err)
	}
	lost := inv.Devices[2].UUID
	inv.Devices[2].Health = node.Unhealthy("XID 79: GPU fell off the bus")
	spec, err := cdi.New(inv)
	if err != nil {
		t.Fatal(err)
	}
	res, err := w.Write(t.Context(), spec)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Changed {
		t.Fatal("a GPU turned unhealthy and the spec was not rewritten")
	}
	got, err := cdi.ValidateFile(res.Path)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range got.Devices {
		if d.Name == "2" || d.Name == lost {
			t.Errorf("unhealthy GPU still in the spec as %s", d.Name)
		}
	}
	b, _ := os.ReadFile(res.Path)
	if strings.Contains(string(b), lost) {
		t.Error("the unhealthy GPU's UUID is still in the file")
	}
}

func TestWriteRefusesInvalid(t *testing.T) {
	w := cdi.Writer{Dir: t.TempDir()}
	good, _ := cdi.New(simInv(t, "dgx1-volta"))
	res, err := w.Write(t.Context(), good)
	if err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(res.Path)
	tests := []struct {
		name string
		spec *specs.Spec
		want error
	}{
		{"bad device name", &specs.Spec{Version: "0.5.0", Kind: cdi.DefaultKind, Devices: []specs.Device{{Name: "gpu 0", ContainerEdits: specs.ContainerEdits{Env: []string{"A=1"}}}}}, cdi.ErrInvalidSpec},
		{"too old a version", &specs.Spec{Version: "0.3.0", Kind: cdi.DefaultKind, Devices: []specs.Device{{Name: "0", ContainerEdits: specs.ContainerEdits{Env: []string{"A=1"}}}}}, cdi.ErrInvalidSpec},
		{"no devices", &specs.Spec{Version: "0.5.0", Kind: cdi.DefaultKind}, cdi.ErrInvalidSpec},
		{"bad kind", &specs.Spec{Version: "0.5.0", Kind: "nvidia"}, cdi.ErrInvalidKind},
		{"nil", nil, node.ErrInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := w.Write(t.Context(), tt.spec)
			if !errors.Is(err, tt.want) {
				t.Fatalf("Write = %v, want %v", err, tt.want)
			}
			after, _ := os.ReadFile(res.Path)
			if string(after) != string(before) {
				t.Error("a refused spec changed the file")
			}
			entries, _ := os.ReadDir(w.Dir)
			if len(entries) != 1 {
				t.Errorf("spec dir holds %d entries, want the spec alone", len(entries))
			}
		})
	}
}

func TestWriteCanceled(t *testing.T) {
	w := cdi.Writer{Dir: t.TempDir()}
	spec, _ := cdi.New(simInv(t, "dgx1-volta"))
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := w.Write(ctx, spec); !errors.Is(err, context.Canceled) {
		t.Fatalf("Write = %v", err)
	}
	if entries, _ := os.ReadDir(w.Dir); len(entries) != 0 {
		t.Errorf("canceled write left %d entries", len(entries))
	}
}

func TestRemove(t *testing.T) {
	w := cdi.Writer{Dir: t.TempDir()}
	spec, _ := cdi.New(simInv(t, "dgx1-volta"))
	res, err := w.Write(t.Context(), spec)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 { // a missing file is not an error
		if err := w.Remove(t.Context(), cdi.DefaultKind); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(res.Path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("spec still there: %v", err)
	}
}

func TestValidateFile(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.json")
	os.WriteFile(bad, []byte(`{"cdiVersion":"0.5.0","kind":"nvidia.com/gpu","devices":[],"unknown":1}`), 0o644)
	if _, err := cdi.ValidateFile(bad); !errors.Is(err, cdi.ErrInvalidSpec) {
		t.Errorf("bad spec: %v", err)
	}
	if _, err := cdi.ValidateFile(filepath.Join(dir, "missing.json")); !errors.Is(err, os.ErrNotExist) || !errors.Is(err, node.ErrNotFound) || errors.Is(err, cdi.ErrInvalidSpec) {
		t.Errorf("missing file: %v", err)
	}
}

// TestNamesResolve: the names a program is given resolve, as a CDI runtime
// resolves them, in what was written: AllocationNames in the node's spec
// (New, Writer.Write), WriteAllocation's Result.Names in the allocation's
// spec; Write's Result.Names are the node spec's devices. A spec that does
// not define the owner's device is refused and nothing is written.
func TestNamesResolve(t *testing.T) {
	inv := simInv(t, "dgx1-volta")
	al := allocator.Allocation{Owner: "task-1", Devices: []node.DeviceRef{inv.Devices[1].Ref(), inv.Devices[2].Ref()}}
	nodeDir := t.TempDir()
	spec, err := cdi.New(inv)
	if err != nil {
		t.Fatal(err)
	}
	res, err := cdi.Writer{Dir: nodeDir}.Write(t.Context(), spec)
	if err != nil {
		t.Fatal(err)
	}
	listed, err := cdi.List(nodeDir)
	if err != nil {
		t.Fatal(err)
	}
	if got := slices.Sorted(slices.Values(res.Names)); !slices.Equal(got, listed) {
		t.Errorf("Write's names %v, the spec directory lists %v", got, listed)
	}
	names, err := cdi.AllocationNames(cdi.DefaultKind, al)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if !slices.Contains(listed, n) {
			t.Errorf("AllocationNames gives %s, which the node's spec does not define (it defines %v)", n, listed)
		}
	}

	allocDir := t.TempDir()
	plan, err := isolator.NewPlan(al.Owner, inv, al.Devices, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	aspec, err := cdi.Render(cdi.DefaultKind, plan)
	if err != nil {
		t.Fatal(err)
	}
	w := cdi.Writer{Dir: allocDir}
	if _, err := w.WriteAllocation(t.Context(), "task-2", aspec); !errors.Is(err, cdi.ErrInvalidSpec) {
		t.Fatalf("WriteAllocation of task-1's spec for task-2: %v, want ErrInvalidSpec", err)
	}
	if entries, _ := os.ReadDir(allocDir); len(entries) != 0 {
		t.Fatalf("a refused allocation spec left %v", entries)
	}
	ares, err := w.WriteAllocation(t.Context(), al.Owner, aspec)
	if err != nil {
		t.Fatal(err)
	}
	listed, err = cdi.List(allocDir)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"nvidia.com/gpu=alloc-task-1"}; !slices.Equal(ares.Names, want) || !slices.Equal(listed, want) {
		t.Errorf("WriteAllocation's names %v, listed %v; want %v", ares.Names, listed, want)
	}
}
