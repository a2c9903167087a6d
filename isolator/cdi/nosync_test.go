package cdi_test

import (
	"errors"
	"os"
	"testing"

	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpuiso/gpuiso/isolator/cdi"
)

// TestWriteNoSync: a Writer with NoSync writes, keeps an unchanged file,
// refuses an invalid spec leaving the file before and no temporary file,
// and removes, as one that syncs does.
func TestWriteNoSync(t *testing.T) {
	w := cdi.Writer{Dir: t.TempDir(), NoSync: true}
	good, err := cdi.New(simInv(t, "dgx1-volta"))
	if err != nil {
		t.Fatal(err)
	}
	res, err := w.Write(t.Context(), good)
	if err != nil || !res.Changed {
		t.Fatalf("first write: %+v, %v", res, err)
	}
	if _, err := cdi.ValidateFile(res.Path); err != nil {
		t.Fatalf("written spec: %v", err)
	}
	if fi, err := os.Stat(res.Path); err != nil || fi.Mode().Perm() != 0o644 {
		t.Fatalf("spec file: %v, %v", fi, err)
	}
	before, _ := os.ReadFile(res.Path)
	if res, err := w.Write(t.Context(), good); err != nil || res.Changed {
		t.Errorf("second write: %+v, %v", res, err)
	}
	bad := &specs.Spec{Version: "0.5.0", Kind: cdi.DefaultKind, Devices: []specs.Device{{Name: "gpu 0", ContainerEdits: specs.ContainerEdits{Env: []string{"A=1"}}}}}
	if _, err := w.Write(t.Context(), bad); !errors.Is(err, cdi.ErrInvalidSpec) {
		t.Errorf("invalid spec: %v", err)
	}
	after, _ := os.ReadFile(res.Path)
	entries, _ := os.ReadDir(w.Dir)
	if string(after) != string(before) || len(entries) != 1 {
		t.Errorf("a refused spec changed the directory: %d entries", len(entries))
	}
	if err := w.Remove(t.Context(), cdi.DefaultKind); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(res.Path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after Remove: %v", err)
	}
}
