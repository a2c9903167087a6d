package volume

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/internal/ldcache"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
)

// These tests lay the host's installed NVIDIA driver out the ways drivers
// are installed in the field (REFERENCE §4), in temporary roots with ld.so
// caches written by the host's ldconfig, and check that every layout gives
// the same volume.

// hostDriver is the host's driver: its version, the real files of the
// libraries by soname, and nvidia-smi ("" when not installed).
type hostDriver struct {
	version string
	libs    map[string]string // soname -> real file
	smi     string
}

func requireHostDriver(t *testing.T) (hostDriver, string) {
	t.Helper()
	testenv.RequireRoot(t) // ldconfig -r chroots
	mlPath := testenv.RequireNVIDIALibraries(t)
	ldconfig := ""
	for _, p := range []string{"/usr/sbin/ldconfig", "/sbin/ldconfig"} {
		if _, err := os.Stat(p); err == nil {
			ldconfig = p
			break
		}
	}
	if ldconfig == "" {
		t.Skip("no ldconfig in /usr/sbin or /sbin")
	}
	hd := hostDriver{libs: map[string]string{}}
	dir := filepath.Dir(mlPath)
	for _, soname := range []string{"libnvidia-ml.so.1", "libcuda.so.1", "libnvidia-ptxjitcompiler.so.1"} {
		real, err := filepath.EvalSymlinks(filepath.Join(dir, soname))
		if err != nil {
			t.Fatalf("host driver: %v", err)
		}
		hd.libs[soname] = real
		if soname == "libnvidia-ml.so.1" {
			hd.version = strings.TrimPrefix(filepath.Base(real), "libnvidia-ml.so.")
		}
	}
	if real, err := filepath.EvalSymlinks("/usr/bin/nvidia-smi"); err == nil {
		hd.smi = real
	}
	return hd, ldconfig
}

// layout builds one driver root from the host's driver.
type layout struct {
	t              *testing.T
	root, ldconfig string
	store          string // the host's files, copied once
}

// put places the stored copy of src at p (hard-linked: the store and the
// roots share a temporary directory).
func (l *layout) put(p, src string) {
	l.t.Helper()
	stored := filepath.Join(l.store, strings.ReplaceAll(src, "/", "_"))
	if _, err := os.Stat(stored); err != nil {
		must(l.t, copyPlain(src, stored))
	}
	must(l.t, os.MkdirAll(filepath.Dir(filepath.Join(l.root, p)), 0o755))
	must(l.t, os.Link(stored, filepath.Join(l.root, p)))
}

func (l *layout) symlink(p, target string) {
	l.t.Helper()
	must(l.t, os.MkdirAll(filepath.Dir(filepath.Join(l.root, p)), 0o755))
	must(l.t, os.Symlink(target, filepath.Join(l.root, p)))
}

func (l *layout) write(p, data string, mode os.FileMode) {
	l.t.Helper()
	must(l.t, os.MkdirAll(filepath.Dir(filepath.Join(l.root, p)), 0o755))
	must(l.t, os.WriteFile(filepath.Join(l.root, p), []byte(data), mode))
}

// ldconfigFor writes the root's etc/ld.so.conf naming dirs and builds its
// etc/ld.so.cache with the host's ldconfig, links left alone.
func (l *layout) ldconfigFor(conf string) {
	l.t.Helper()
	l.write("etc/ld.so.conf", conf, 0o644)
	if out, err := exec.Command(l.ldconfig, "-X", "-r", l.root).CombinedOutput(); err != nil {
		l.t.Fatalf("ldconfig -r %s: %v: %s", l.root, err, out)
	}
}

func copyPlain(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, fi.Mode().Perm())
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	return errors.Join(err, out.Close())
}

func TestHostLayouts(t *testing.T) {
	hd, ldconfig := requireHostDriver(t)
	base := t.TempDir()
	store := filepath.Join(base, "store")
	must(t, os.Mkdir(store, 0o755))
	v := hd.version
	const x64 = "usr/lib/x86_64-linux-gnu"

	tests := []struct {
		name string
		// build lays the driver out under l.root and returns the driver
		// root to read (l.root or a directory below it) and the roots to
		// try.
		build func(l *layout) (driverRoot string, roots []string)
	}{
		{"debian alternatives", func(l *layout) (string, []string) {
			l.symlink("lib", "usr/lib")
			cur := x64 + "/nvidia/current"
			for soname, src := range hd.libs {
				real := filepath.Base(src)
				l.put(cur+"/"+real, src)
				l.symlink(cur+"/"+soname, real)
				alt := "etc/alternatives/nvidia--" + soname + "-x86_64-linux-gnu"
				l.symlink(alt, "/"+cur+"/"+soname)
				l.symlink(x64+"/"+soname, "/"+alt)
			}
			if hd.smi != "" {
				l.put("usr/lib/nvidia/current/nvidia-smi", hd.smi)
				l.symlink("etc/alternatives/nvidia--nvidia-smi", "/usr/lib/nvidia/current/nvidia-smi")
				l.symlink("usr/bin/nvidia-smi", "/etc/alternatives/nvidia--nvidia-smi")
			}
			l.ldconfigFor("/" + x64 + "\n")
			return l.root, []string{l.root}
		}},
		{"run installer and ubuntu", func(l *layout) (string, []string) {
			l.symlink("lib", "usr/lib")
			for soname, src := range hd.libs {
				real := filepath.Base(src)
				l.put(x64+"/"+real, src)
				l.symlink(x64+"/"+soname, real)
			}
			if hd.smi != "" {
				l.put("usr/bin/nvidia-smi", hd.smi)
			}
			l.ldconfigFor("/" + x64 + "\n")
			return l.root, []string{l.root}
		}},
		{"driver on its own file system", func(l *layout) (string, []string) {
			l.symlink("lib", "usr/lib")
			for soname, src := range hd.libs {
				real := filepath.Base(src)
				l.put("usr/local/nvidia/lib64/"+real, src)
				l.symlink("usr/local/nvidia/lib64/"+soname, real)
				l.symlink("usr/lib/"+soname, "/usr/local/nvidia/lib64/"+soname)
			}
			if hd.smi != "" {
				l.put("usr/local/nvidia/bin/nvidia-smi", hd.smi)
				l.write("usr/bin/nvidia-smi", "#!/bin/sh\nexec /usr/local/nvidia/bin/nvidia-smi \"$@\"\n", 0o755)
			}
			l.write("etc/ld.so.conf.d/nvidia.conf", "/usr/local/nvidia/lib64\n", 0o644)
			l.ldconfigFor("include /etc/ld.so.conf.d/*.conf\n")
			return l.root, []string{l.root}
		}},
		{"containerised driver found under its root", func(l *layout) (string, []string) {
			// The host's own root has an ld.so cache without the driver.
			empty, err := ldcache.Encode(nil, ldcache.LayoutNew)
			must(t, err)
			l.write("etc/ld.so.cache", string(empty), 0o644)
			host := l.root
			l.root = filepath.Join(host, "run/nvidia/driver")
			l.symlink("lib", "usr/lib")
			for soname, src := range hd.libs {
				real := filepath.Base(src)
				l.put(x64+"/"+real, src)
				l.symlink(x64+"/"+soname, real)
			}
			if hd.smi != "" {
				l.put("usr/bin/nvidia-smi", hd.smi)
			}
			l.ldconfigFor("/" + x64 + "\n")
			return l.root, []string{host, l.root, filepath.Join(host, "home/kubernetes/bin/nvidia")}
		}},
	}

	want := []string{"lib64/libcuda.so", "lib64/libcuda.so.1", "lib64/libcuda.so." + v,
		"lib64/libnvidia-ml.so.1", "lib64/libnvidia-ml.so." + v,
		"lib64/libnvidia-ptxjitcompiler.so.1", "lib64/libnvidia-ptxjitcompiler.so." + v}
	if hd.smi != "" {
		want = append(want, "bin/nvidia-smi")
	}
	slices.Sort(want)
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := &layout{t: t, root: filepath.Join(base, "layout"+string(rune('a'+i))), ldconfig: ldconfig, store: store}
			driverRoot, roots := tt.build(l)
			m, err := New(WithRoot(filepath.Join(t.TempDir(), "volumes")), WithDriverRoots(roots...),
				WithProcRoot(filepath.Join(base, "noproc")), WithCapabilities(Utility, Compute))
			must(t, err)
			ctx := context.Background()
			if got, err := m.DriverRoot(ctx); err != nil || got != driverRoot {
				t.Fatalf("DriverRoot = %q, %v; want %q", got, err, driverRoot)
			}
			if got, err := m.DriverVersion(ctx); err != nil || got != v {
				t.Fatalf("DriverVersion = %q, %v; want %q", got, err, v)
			}
			c, err := m.Contents(ctx, v)
			must(t, err)
			var got []string
			for _, f := range c.Files {
				got = append(got, f.Path)
				if !strings.HasPrefix(f.Source, driverRoot+"/") {
					t.Errorf("%s taken from %s, outside the driver root %s", f.Path, f.Source, driverRoot)
				}
				if f.Path == "bin/nvidia-smi" && !isELF(f.Source) {
					t.Errorf("nvidia-smi taken from the script %s", f.Source)
				}
			}
			for _, k := range c.Links {
				got = append(got, k.Path)
			}
			slices.Sort(got)
			if !slices.Equal(got, want) {
				t.Errorf("volume paths\n%s\nwant\n%s\nwarnings:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"), strings.Join(c.Warnings, "\n"))
			}
			if len(c.Warnings) > 0 {
				t.Logf("warnings:\n%s", strings.Join(c.Warnings, "\n"))
			}
		})
	}
}
