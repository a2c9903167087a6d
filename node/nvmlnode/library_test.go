package nvmlnode_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
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

// TestErrorTextStable: an NVML error reads the same before and after a real
// NVML library was loaded in the process (go-nvml's ErrorString switches to
// the library's prose then).
func TestErrorTextStable(t *testing.T) {
	e := &nvmlnode.NVMLError{Op: "get uuid", Device: 3, Return: nvml.ERROR_GPU_IS_LOST}
	before := e.Error()
	if lib, err := findLibrary(); err == nil {
		l := nvml.New(nvml.WithLibraryPath(lib))
		if l.Init() == nvml.SUCCESS {
			defer l.Shutdown()
		}
	}
	if after := e.Error(); after != before || !strings.Contains(after, "ERROR_GPU_IS_LOST") {
		t.Fatalf("before %q, after %q", before, after)
	}
}

func findLibrary() (string, error) {
	for _, p := range []string{"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", "/usr/lib64/libnvidia-ml.so.1"} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", os.ErrNotExist
}
