package nvmlnode_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/gpuiso/gpuiso/internal/testenv"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
)

func TestCheckLibrary(t *testing.T) {
	dir := t.TempDir()
	text := filepath.Join(dir, "text.so")
	if err := os.WriteFile(text, []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if err := nvmlnode.CheckLibrary(filepath.Join(dir, "none.so")); !errors.Is(err, nvmlnode.ErrLibraryNotFound) {
		t.Errorf("missing file: %v, want ErrLibraryNotFound", err)
	}
	for _, p := range []string{text, exe} {
		if err := nvmlnode.CheckLibrary(p); !errors.Is(err, nvmlnode.ErrNotNVML) || !errors.Is(err, node.ErrInvalid) {
			t.Errorf("%s: %v, want ErrNotNVML (node.ErrInvalid)", p, err)
		}
	}
	t.Run("real", func(t *testing.T) {
		lib := testenv.RequireNVIDIALibraries(t)
		if err := nvmlnode.CheckLibrary(lib); err != nil {
			t.Fatal(err)
		}
	})
}
