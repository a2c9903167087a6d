package volume

import (
	"context"
	"errors"
	"io/fs"
	"path/filepath"
	"testing"

	"github.com/gpuiso/gpuiso/internal/ldcache"
	"github.com/gpuiso/gpuiso/node"
)

// TestLibrary: a library is found through the driver root's ld.so cache,
// its links followed inside the root; a 32-bit, missing, dangling or
// escaping entry is not taken, and each failure says why.
func TestLibrary(t *testing.T) {
	const version = "535.309.01"
	tr := driverTree(t, version)
	tr.lib32("libnvidia-only32", "libnvidia-only32.so.1", version)
	// A dangling first entry, then one that leads to the file.
	tr.cache("libnvidia-twice.so.1", "/lib/x86_64-linux-gnu/gone.so", ldcache.FlagELFLibc6|ldcache.FlagX8664Lib64)
	tr.debianLib("libnvidia-twice", "libnvidia-twice.so.1", version)
	// An entry whose chain ends at a directory.
	tr.mkdir("usr/lib/x86_64-linux-gnu/libnvidia-dir.so.1")
	tr.cache("libnvidia-dir.so.1", "/lib/x86_64-linux-gnu/libnvidia-dir.so.1", ldcache.FlagELFLibc6|ldcache.FlagX8664Lib64)
	tr.writeCache()
	m := tr.manager()
	current := filepath.Join(tr.root, "usr/lib/x86_64-linux-gnu/nvidia/current")

	tests := []struct {
		name, soname string
		want         string  // the host path, when found
		is           []error // what the error matches, when not
	}{
		{"through merged usr and the alternatives", "libnvidia-ml.so.1", filepath.Join(current, "libnvidia-ml.so."+version), nil},
		{"the 64-bit one of two classes", "libcuda.so.1", filepath.Join(current, "libcuda.so."+version), nil},
		{"first entry dangles", "libnvidia-twice.so.1", filepath.Join(current, "libnvidia-twice.so."+version), nil},
		{"32-bit only", "libnvidia-only32.so.1", "", []error{ErrNoDriver, node.ErrNotFound}},
		{"not in the cache", "libnvidia-absent.so.1", "", []error{ErrNoDriver, node.ErrNotFound}},
		{"link escapes the root", "libnvidia-encode.so.1", "", []error{ErrNoDriver, ErrEscapesRoot}},
		{"a directory", "libnvidia-dir.so.1", "", []error{ErrNoDriver}},
		{"not one name", "../libnvidia-ml.so.1", "", []error{ErrInvalidName, node.ErrInvalid}},
		{"empty", "", "", []error{ErrInvalidName}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := m.Library(context.Background(), tt.soname)
			if tt.is == nil {
				if err != nil || got != tt.want {
					t.Fatalf("Library(%q) = %q, %v; want %s", tt.soname, got, err, tt.want)
				}
				return
			}
			if err == nil {
				t.Fatalf("Library(%q) = %q; want an error", tt.soname, got)
			}
			for _, target := range tt.is {
				if !errors.Is(err, target) {
					t.Errorf("Library(%q) = %v; does not match %v", tt.soname, err, target)
				}
			}
		})
	}
}

// TestLibraryNoCache: a driver root without an ld.so cache has no library
// to name, and a cancelled context stops the lookup.
func TestLibraryNoCache(t *testing.T) {
	tr := newTree(t)
	tr.debianLib("libnvidia-ml", "libnvidia-ml.so.1", "535.309.01")
	m := tr.manager()
	if got, err := m.Library(context.Background(), "libnvidia-ml.so.1"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Library without a cache = %q, %v; want an error matching fs.ErrNotExist", got, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	tr.writeCache()
	if _, err := m.Library(ctx, "libnvidia-ml.so.1"); !errors.Is(err, context.Canceled) {
		t.Errorf("Library with a cancelled context: %v; want context.Canceled", err)
	}
}
