package volume

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	"github.com/gpuiso/gpuiso/internal/ldcache"
)

// makeELF returns a minimal ELF shared object of the given class with a
// dynamic section naming soname and needed: enough for debug/elf, not for a
// linker.
func makeELF(class elf.Class, soname string, needed ...string) []byte {
	le := binary.LittleEndian
	dynstr := []byte{0}
	addStr := func(s string) uint64 {
		off := uint64(len(dynstr))
		dynstr = append(append(dynstr, s...), 0)
		return off
	}
	type dyn struct{ tag, val uint64 }
	var dyns []dyn
	if soname != "" {
		dyns = append(dyns, dyn{uint64(elf.DT_SONAME), addStr(soname)})
	}
	for _, n := range needed {
		dyns = append(dyns, dyn{uint64(elf.DT_NEEDED), addStr(n)})
	}
	dyns = append(dyns, dyn{uint64(elf.DT_NULL), 0})
	shstr := []byte("\x00.dynstr\x00.dynamic\x00.shstrtab\x00")

	is64 := class == elf.ELFCLASS64
	ehsize, shentsize, dynent := 52, 40, 8
	machine := elf.EM_386
	if is64 {
		ehsize, shentsize, dynent, machine = 64, 64, 16, elf.EM_X86_64
	}
	var dynamic bytes.Buffer
	for _, d := range dyns {
		if is64 {
			binary.Write(&dynamic, le, d)
		} else {
			binary.Write(&dynamic, le, [2]uint32{uint32(d.tag), uint32(d.val)})
		}
	}
	dynstrOff := ehsize
	dynamicOff := dynstrOff + len(dynstr)
	dynamicOff += (8 - dynamicOff%8) % 8
	shstrOff := dynamicOff + dynamic.Len()
	shOff := shstrOff + len(shstr)
	shOff += (8 - shOff%8) % 8

	out := make([]byte, shOff+4*shentsize)
	copy(out, elf.ELFMAG)
	out[elf.EI_CLASS] = byte(class)
	out[elf.EI_DATA] = byte(elf.ELFDATA2LSB)
	out[elf.EI_VERSION] = byte(elf.EV_CURRENT)
	le.PutUint16(out[16:], uint16(elf.ET_DYN))
	le.PutUint16(out[18:], uint16(machine))
	le.PutUint32(out[20:], uint32(elf.EV_CURRENT))
	if is64 {
		le.PutUint64(out[40:], uint64(shOff))
		le.PutUint16(out[52:], uint16(ehsize))
		le.PutUint16(out[58:], uint16(shentsize))
		le.PutUint16(out[60:], 4)
		le.PutUint16(out[62:], 3)
	} else {
		le.PutUint32(out[32:], uint32(shOff))
		le.PutUint16(out[40:], uint16(ehsize))
		le.PutUint16(out[46:], uint16(shentsize))
		le.PutUint16(out[48:], 4)
		le.PutUint16(out[50:], 3)
	}
	copy(out[dynstrOff:], dynstr)
	copy(out[dynamicOff:], dynamic.Bytes())
	copy(out[shstrOff:], shstr)
	section := func(i int, name uint32, typ elf.SectionType, off, size, link, entsize int) {
		b := out[shOff+i*shentsize:]
		le.PutUint32(b[0:], name)
		le.PutUint32(b[4:], uint32(typ))
		if is64 {
			le.PutUint64(b[24:], uint64(off))
			le.PutUint64(b[32:], uint64(size))
			le.PutUint32(b[40:], uint32(link))
			le.PutUint64(b[48:], 1)
			le.PutUint64(b[56:], uint64(entsize))
		} else {
			le.PutUint32(b[16:], uint32(off))
			le.PutUint32(b[20:], uint32(size))
			le.PutUint32(b[24:], uint32(link))
			le.PutUint32(b[32:], 1)
			le.PutUint32(b[36:], uint32(entsize))
		}
	}
	section(1, 1, elf.SHT_STRTAB, dynstrOff, len(dynstr), 0, 0)
	section(2, 9, elf.SHT_DYNAMIC, dynamicOff, dynamic.Len(), 1, dynent)
	section(3, 18, elf.SHT_STRTAB, shstrOff, len(shstr), 0, 0)
	return out
}

// tree builds a driver root in a temporary directory the way Debian lays
// out its NVIDIA packages.
type tree struct {
	t       testing.TB
	root    string
	entries []ldcache.Entry
}

func newTree(t testing.TB) *tree {
	tr := &tree{t: t, root: filepath.Join(t.TempDir(), "driver")}
	tr.mkdir("usr/lib/x86_64-linux-gnu")
	tr.symlink("lib", "usr/lib") // merged /usr
	return tr
}

func (tr *tree) mkdir(p string) {
	tr.t.Helper()
	if err := os.MkdirAll(filepath.Join(tr.root, p), 0o755); err != nil {
		tr.t.Fatal(err)
	}
}

func (tr *tree) file(p string, data []byte, mode os.FileMode) {
	tr.t.Helper()
	tr.mkdir(filepath.Dir(p))
	if err := os.WriteFile(filepath.Join(tr.root, p), data, mode); err != nil {
		tr.t.Fatal(err)
	}
}

func (tr *tree) symlink(p, target string) {
	tr.t.Helper()
	tr.mkdir(filepath.Dir(p))
	if err := os.Symlink(target, filepath.Join(tr.root, p)); err != nil {
		tr.t.Fatal(err)
	}
}

func (tr *tree) cache(key, value string, flags int32) {
	tr.entries = append(tr.entries, ldcache.Entry{Key: key, Value: value, Flags: flags})
}

// debianLib installs a 64-bit library the Debian way: the real file in
// nvidia/current, reached from /lib/x86_64-linux-gnu through /etc/alternatives.
func (tr *tree) debianLib(stem, soname, version string, needed ...string) {
	cur := "usr/lib/x86_64-linux-gnu/nvidia/current/"
	real := stem + ".so." + version
	tr.file(cur+real, makeELF(elf.ELFCLASS64, soname, needed...), 0o644)
	tr.symlink(cur+soname, real)
	alt := "etc/alternatives/nvidia--" + soname + "-x86_64-linux-gnu"
	tr.symlink(alt, "/"+cur+soname)
	tr.symlink("usr/lib/x86_64-linux-gnu/"+soname, "/"+alt)
	tr.cache(soname, "/lib/x86_64-linux-gnu/"+soname, ldcache.FlagELFLibc6|ldcache.FlagX8664Lib64)
}

// lib32 installs a 32-bit library in /usr/lib/i386-linux-gnu.
func (tr *tree) lib32(stem, soname, version string) {
	dir := "usr/lib/i386-linux-gnu/"
	real := stem + ".so." + version
	tr.file(dir+real, makeELF(elf.ELFCLASS32, soname), 0o644)
	tr.symlink(dir+soname, real)
	tr.cache(soname, "/"+dir+soname, ldcache.FlagELFLibc6)
}

// writeCache writes the ld.so cache of the entries so far.
func (tr *tree) writeCache() {
	tr.t.Helper()
	b, err := ldcache.Encode(tr.entries, ldcache.LayoutCompat)
	if err != nil {
		tr.t.Fatal(err)
	}
	tr.file("etc/ld.so.cache", b, 0o644)
}

// driverTree is a driver of the given version with utility, compute,
// graphics and compat32 parts, a Mesa library, a leftover of another
// version and a few hostile entries.
func driverTree(t testing.TB, version string) *tree {
	tr := newTree(t)
	tr.debianLib("libnvidia-ml", "libnvidia-ml.so.1", version)
	tr.debianLib("libcuda", "libcuda.so.1", version)
	tr.cache("libcuda.so", "/lib/x86_64-linux-gnu/libcuda.so.1", ldcache.FlagELFLibc6|ldcache.FlagX8664Lib64)
	tr.debianLib("libnvidia-ptxjitcompiler", "libnvidia-ptxjitcompiler.so.1", version)
	tr.debianLib("libnvidia-cfg", "libnvidia-cfg.so.1", "470.1") // an old driver's leftover
	tr.debianLib("libGLX_nvidia", "libGLX_nvidia.so.0", version, "libnvidia-glcore.so."+version)
	tr.lib32("libcuda", "libcuda.so.1", version)
	// pkcs11 has no soname link: the cache names the file itself.
	tr.file("usr/lib/x86_64-linux-gnu/libnvidia-pkcs11-openssl3.so."+version, makeELF(elf.ELFCLASS64, "libnvidia-pkcs11-openssl3.so."+version), 0o644)
	tr.cache("libnvidia-pkcs11-openssl3.so."+version, "/lib/x86_64-linux-gnu/libnvidia-pkcs11-openssl3.so."+version, ldcache.FlagELFLibc6|ldcache.FlagX8664Lib64)
	// GLVND's libGL needs the dispatcher: taken. Mesa's GLESv2 is not.
	tr.file("usr/lib/x86_64-linux-gnu/libGL.so.1.7.0", makeELF(elf.ELFCLASS64, "libGL.so.1", "libGLdispatch.so.0", "libGLX.so.0"), 0o644)
	tr.symlink("usr/lib/x86_64-linux-gnu/libGL.so.1", "libGL.so.1.7.0")
	tr.cache("libGL.so.1", "/lib/x86_64-linux-gnu/libGL.so.1", ldcache.FlagELFLibc6|ldcache.FlagX8664Lib64)
	tr.file("usr/lib/x86_64-linux-gnu/libGLESv2.so.2.0.0", makeELF(elf.ELFCLASS64, "libGLESv2.so.2", "libglapi.so.0"), 0o644)
	tr.symlink("usr/lib/x86_64-linux-gnu/libGLESv2.so.2", "libGLESv2.so.2.0.0")
	tr.cache("libGLESv2.so.2", "/lib/x86_64-linux-gnu/libGLESv2.so.2", ldcache.FlagELFLibc6|ldcache.FlagX8664Lib64)
	// Hostile: a name with "..", and a link climbing out of the driver
	// root.
	tr.cache("libnvidia-nvvm.so/../../x", "/lib/x86_64-linux-gnu/libnvidia-nvvm.so.4", ldcache.FlagELFLibc6|ldcache.FlagX8664Lib64)
	tr.file("etc/libnvidia-encode.so."+version, makeELF(elf.ELFCLASS64, "libnvidia-encode.so.1"), 0o644)
	tr.symlink("usr/lib/x86_64-linux-gnu/libnvidia-encode.so.1", "../../../../etc/libnvidia-encode.so."+version)
	tr.cache("libnvidia-encode.so.1", "/lib/x86_64-linux-gnu/libnvidia-encode.so.1", ldcache.FlagELFLibc6|ldcache.FlagX8664Lib64)
	tr.writeCache()
	// nvidia-smi the Debian way; a second copy further down the search path.
	tr.file("usr/lib/nvidia/current/nvidia-smi", []byte("#!/bin/sh\necho nvidia-smi "+version+"\n"), 0o755)
	tr.symlink("etc/alternatives/nvidia--nvidia-smi", "/usr/lib/nvidia/current/nvidia-smi")
	tr.symlink("usr/bin/nvidia-smi", "/etc/alternatives/nvidia--nvidia-smi")
	tr.file("usr/local/bin/nvidia-smi", []byte("#!/bin/sh\necho wrong\n"), 0o755)
	tr.file("usr/bin/nvidia-cuda-mps-control", []byte("#!/bin/sh\n"), 0o644) // not executable
	return tr
}

// manager returns a manager of the tree with a root in a temporary
// directory.
func (tr *tree) manager(opts ...Option) *Manager {
	tr.t.Helper()
	base := []Option{
		WithRoot(filepath.Join(tr.t.TempDir(), "volumes")),
		WithDriverRoot(tr.root),
		WithProcRoot(filepath.Join(tr.root, "proc")),
	}
	m, err := New(append(base, opts...)...)
	if err != nil {
		tr.t.Fatal(err)
	}
	return m
}
