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
// adds no library directory. The directories are named under as, the
// same root as the daemon's mount namespace shows it ("" for root itself;
// see WithMountNamespace).
func driverDirs(root, as string) (bin, lib []string) {
	if as == "" {
		as = root
	}
	if root == "" || as == "" || filepath.Clean(as) == "/" {
		return nil, nil
	}
	for _, d := range []string{"usr/bin", "usr/sbin", "bin", "sbin"} {
		bin = append(bin, filepath.Join(as, d))
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
		if d := filepath.Join(as, filepath.Dir(e.Value)); !slices.Contains(lib, d) {
			lib = append(lib, d)
		}
	}
	return bin, lib
}
