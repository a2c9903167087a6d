package mps

import (
	"os"
	"path/filepath"
	"runtime"
	"slices"

	"github.com/gpuiso/gpuiso/internal/ldcache"
)

// driverDirs are what a daemon whose binary is under a driver root other
// than / needs of that root: its program directories, for PATH (the
// control daemon starts nvidia-cuda-mps-server by name), and the
// directories of its libcuda.so.1 as the root's own ld.so.cache names
// them, for LD_LIBRARY_PATH (the server loads it, and the loader reads
// the cache of the manager's root, not the driver's). A root without a
// cache, or whose cache names no libcuda.so.1 of this machine's word size,
// adds no library directory.
func driverDirs(root string) (bin, lib []string) {
	if root == "" || filepath.Clean(root) == "/" {
		return nil, nil
	}
	for _, d := range []string{"usr/bin", "usr/sbin", "bin", "sbin"} {
		bin = append(bin, filepath.Join(root, d))
	}
	b, err := os.ReadFile(filepath.Join(root, "etc", "ld.so.cache"))
	if err != nil {
		return bin, nil
	}
	c, err := ldcache.Parse(b)
	if err != nil {
		return bin, nil
	}
	bits := 64
	if runtime.GOARCH == "386" || runtime.GOARCH == "arm" {
		bits = 32
	}
	for _, e := range c.Entries {
		if e.Key != "libcuda.so.1" || !e.IsELF() || e.Bits() != bits || !filepath.IsAbs(e.Value) {
			continue
		}
		if d := filepath.Join(root, filepath.Dir(e.Value)); !slices.Contains(lib, d) {
			lib = append(lib, d)
		}
	}
	return bin, lib
}
