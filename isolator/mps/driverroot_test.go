package mps

import (
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/internal/ldcache"
)

// TestDriverDirs: a driver root other than / gives a daemon the root's
// program directories and the directories of the libcuda.so.1 its own
// ld.so.cache names, under the root; / and a root without a cache give
// no library directory.
func TestDriverDirs(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("the cache below is of x86-64 libraries")
	}
	root := t.TempDir()
	lib64 := ldcache.FlagELFLibc6 | ldcache.FlagX8664Lib64
	b, err := ldcache.Encode([]ldcache.Entry{
		{Key: "libcuda.so.1", Value: "/usr/lib/x86_64-linux-gnu/libcuda.so.1", Flags: int32(lib64)},
		{Key: "libcuda.so.1", Value: "/usr/lib/i386-linux-gnu/libcuda.so.1", Flags: ldcache.FlagELFLibc6},
		{Key: "libc.so.6", Value: "/lib/x86_64-linux-gnu/libc.so.6", Flags: int32(lib64)},
	}, ldcache.LayoutNew)
	if err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(root, "etc"), 0o755)
	if err := os.WriteFile(filepath.Join(root, "etc", "ld.so.cache"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	bin, lib := driverDirs(root, "")
	if want := []string{filepath.Join(root, "usr/lib/x86_64-linux-gnu")}; !slices.Equal(lib, want) {
		t.Errorf("library directories %v, want %v", lib, want)
	}
	if !slices.Contains(bin, filepath.Join(root, "usr/sbin")) || !slices.Contains(bin, filepath.Join(root, "usr/bin")) {
		t.Errorf("program directories %v lack the root's usr/bin and usr/sbin", bin)
	}
	m := &Manager{bin: filepath.Join(root, "usr/bin", ControlBinary), driverRoot: root}
	env := strings.Join(m.env("GPU-1", "mark"), "\n")
	if !strings.Contains(env, "LD_LIBRARY_PATH="+filepath.Join(root, "usr/lib/x86_64-linux-gnu")) ||
		!strings.Contains(env, "PATH="+daemonServerDir+":"+filepath.Join(root, "usr/bin")+":"+filepath.Join(root, "usr/bin")+":"+filepath.Join(root, "usr/sbin")) {
		t.Errorf("the daemon's environment lacks the driver root's directories:\n%s", env)
	}
	for _, r := range []string{"", "/", t.TempDir()} {
		if _, lib := driverDirs(r, ""); len(lib) > 0 {
			t.Errorf("root %q: library directories %v, want none", r, lib)
		}
	}
	// The same root as another namespace shows it: its cache, its paths.
	if _, lib := driverDirs(root, "/host/driver"); !slices.Equal(lib, []string{"/host/driver/usr/lib/x86_64-linux-gnu"}) {
		t.Errorf("library directories as /host/driver: %v", lib)
	}
	if bin, lib := driverDirs(root, "/"); len(bin)+len(lib) > 0 {
		t.Errorf("as /: %v, %v, want none (the loader's own)", bin, lib)
	}
	m.nsDriverRoot = "/host/driver"
	if got := m.daemonBin(); got != "/host/driver/usr/bin/"+ControlBinary {
		t.Errorf("the daemon's binary is %s, want it under the namespace's driver root", got)
	}
	m.bin = "/elsewhere/" + ControlBinary
	if got := m.daemonBin(); got != m.bin {
		t.Errorf("a binary outside the driver root became %s", got)
	}
}
