package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

// TestFindNVMLThroughCache: the driver root's ld.so cache decides which
// file is NVML (its 64-bit entry, in a directory no distribution uses,
// its link followed inside the root), before the usual library
// directories are searched. testdata/ld.so.cache names
// libnvidia-ml.so.1 twice: /opt/driver/lib (32-bit) and /opt/driver/lib64.
func TestFindNVMLThroughCache(t *testing.T) {
	root := t.TempDir()
	cache, err := os.ReadFile("testdata/ld.so.cache")
	if err != nil {
		t.Fatal(err)
	}
	write := func(p string, data []byte) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, p), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("etc/ld.so.cache", cache)
	write("usr/lib64/libnvidia-ml.so.1", nil) // another driver's leftover
	write("opt/driver/lib/libnvidia-ml.so.1", nil)
	write("opt/driver/real/libnvidia-ml.so.580.1", nil)
	if err := os.MkdirAll(filepath.Join(root, "opt/driver/lib64"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/opt/driver/real/libnvidia-ml.so.580.1", filepath.Join(root, "opt/driver/lib64/libnvidia-ml.so.1")); err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(root, "opt/driver/real/libnvidia-ml.so.580.1")
	if got, err := findNVML(context.Background(), root); err != nil || got != want {
		t.Fatalf("findNVML = %q, %v; want %s", got, err, want)
	}
}
