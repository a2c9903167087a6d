package volume

import (
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"

	"github.com/gpuiso/gpuiso/internal/ldcache"
)

// Directories of a volume.
const (
	BinDir   = "bin"   // programs
	LibDir   = "lib"   // 32-bit libraries (ELF class 32)
	Lib64Dir = "lib64" // 64-bit libraries (ELF class 64)
)

// Contents is what belongs in the volume of one driver version: the files to
// take from the host and the symlinks to add. Paths are relative to the
// volume's directory, with "/" separators.
type Contents struct {
	// Version is the driver version the files belong to.
	Version string
	// Capabilities are the capabilities the contents serve.
	Capabilities []Capability
	// Files are the programs and libraries, in volume path order.
	Files []File
	// Links are the soname symlinks (and libcuda.so), in path order.
	Links []Link
	// Warnings tell what was found but left out, and why, one a line.
	Warnings []string
}

// File is one program or library of a volume.
type File struct {
	// Path is the file's path in the volume, e.g. "lib64/libcuda.so.535.309.01".
	Path string `json:"path"`
	// Source is the host path of the file, symlinks resolved.
	Source string `json:"source"`
	// Capability is the capability that brought the file in.
	Capability Capability `json:"capability"`
}

// Link is one symlink of a volume; Target is a name in the same directory.
type Link struct {
	Path   string `json:"path"`
	Target string `json:"target"`
}

// Contents works out what belongs in the volume of the given driver version,
// reading the ld.so cache of the driver root ([Manager.DriverRoot]), its
// binary directories and the ELF headers of the libraries. It changes
// nothing. The directories the cache names are the library directories:
// every symlink chain is followed inside the driver root and only what
// escapes it is refused. Files that cannot be read or do not belong are left
// out with a warning; it fails only when the cache cannot be read or nothing
// of the driver is found.
func (m *Manager) Contents(ctx context.Context, version string) (*Contents, error) {
	if err := m.made(); err != nil {
		return nil, err
	}
	return m.contents(ctx, version, m.cfg.caps)
}

func (m *Manager) contents(ctx context.Context, version string, caps []Capability) (*Contents, error) {
	if err := ValidateVersion(version); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	d, err := m.driver(ctx)
	if err != nil {
		return nil, err
	}
	c := &collector{m: m, d: d, version: version, out: &Contents{Version: version, Capabilities: caps}, seen: map[string]string{}}
	for _, e := range d.cache.Entries {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		c.library(e)
	}
	for _, cp := range caps {
		for _, name := range binaries(cp) {
			c.binary(cp, name)
		}
	}
	c.addCudaLinks()
	if len(c.libDirs) == 0 && len(c.others) > 0 {
		slices.Sort(c.others)
		return c.out, &VersionMismatchError{Version: version, Found: slices.Compact(c.others)}
	}
	if len(c.out.Files) == 0 {
		return c.out, fmt.Errorf("driver %s under %s (capabilities %v): %w", version, d.root, caps, ErrNoDriver)
	}
	slices.SortFunc(c.out.Files, func(a, b File) int { return strings.Compare(a.Path, b.Path) })
	slices.SortFunc(c.out.Links, func(a, b Link) int { return strings.Compare(a.Path, b.Path) })
	return c.out, nil
}

type collector struct {
	m       *Manager
	d       *driver
	version string
	out     *Contents
	seen    map[string]string // volume path -> source
	// libDirs are the directories, as the driver root sees them, that the
	// driver's libraries were found in, in the order found.
	libDirs []string
	// others are the versions of the driver's libraries of another version.
	others []string
}

func (c *collector) warn(format string, args ...any) {
	c.out.Warnings = append(c.out.Warnings, fmt.Sprintf(format, args...))
}

// capabilityOf returns the capability whose library list holds the library
// that key names, and whether it is a generic GL library.
func (c *collector) capabilityOf(key string) (Capability, bool, bool) {
	stem, _, ok := strings.Cut(key, ".so")
	if !ok {
		return "", false, false
	}
	for _, cp := range c.out.Capabilities {
		if slices.Contains(libraries(cp), stem) {
			return cp, false, true
		}
	}
	if slices.Contains(c.out.Capabilities, Graphics) && slices.Contains(genericGL(), stem) {
		return Graphics, true, true
	}
	return "", false, false
}

func (c *collector) library(e ldcache.Entry) {
	if !e.IsELF() {
		return
	}
	cp, generic, ok := c.capabilityOf(e.Key)
	if !ok {
		return
	}
	if !validName(e.Key) {
		c.warn("ld.so cache name %q rejected: %v", e.Key, ErrInvalidName)
		return
	}
	resolved, err := resolve(c.d.root, e.Value)
	if err != nil {
		c.warn("%s: %v", e.Key, err)
		return
	}
	name := path.Base(resolved)
	if !generic && !strings.HasSuffix(name, ".so."+c.version) {
		c.warn("%s: %s is not of driver %s", e.Key, resolved, c.version)
		if _, v, ok := strings.Cut(name, ".so."); ok && ValidateVersion(v) == nil && strings.Contains(v, ".") {
			c.others = append(c.others, v)
		}
		return
	}
	src := c.d.hostPath(resolved)
	fi, err := os.Lstat(src)
	if err != nil {
		c.warn("%s: %v", e.Key, err)
		return
	}
	if !fi.Mode().IsRegular() {
		c.warn("%s: %s is not a regular file", e.Key, resolved)
		return
	}
	f, err := elf.Open(src)
	if err != nil {
		c.warn("%s: %s: %v", e.Key, resolved, err)
		return
	}
	defer f.Close()
	dir := Lib64Dir
	switch f.Class {
	case elf.ELFCLASS64:
	case elf.ELFCLASS32:
		if !slices.Contains(c.out.Capabilities, Compat32) {
			return
		}
		dir = LibDir
	default:
		c.warn("%s: %s: ELF class %v", e.Key, resolved, f.Class)
		return
	}
	if generic {
		needed, _ := f.DynString(elf.DT_NEEDED)
		if !slices.ContainsFunc(needed, func(n string) bool {
			return slices.ContainsFunc(genericGLNeeds(), func(p string) bool { return strings.HasPrefix(n, p) })
		}) {
			return // another vendor's (Mesa's) GL library
		}
	}
	soname := e.Key
	if s, err := f.DynString(elf.DT_SONAME); err == nil && len(s) > 0 {
		soname = s[0]
	}
	if !validName(soname) || !validName(name) {
		c.warn("%s: name %q or soname %q rejected: %v", e.Key, name, soname, ErrInvalidName)
		return
	}
	if !generic && !slices.Contains(c.libDirs, path.Dir(resolved)) {
		c.libDirs = append(c.libDirs, path.Dir(resolved))
	}
	if c.addFile(File{Path: dir + "/" + name, Source: src, Capability: cp}) && soname != name {
		c.addLink(Link{Path: dir + "/" + soname, Target: name})
	}
}

// binDirs are the directories searched for the driver's programs: the
// configured ones, then the bin directory beside each lib, lib32 or lib64
// directory the driver's libraries were found in (/usr/local/nvidia/bin for
// /usr/local/nvidia/lib64).
func (c *collector) binDirs() []string {
	dirs := slices.Clone(c.m.cfg.binDirs)
	for _, d := range c.libDirs {
		switch path.Base(d) {
		case "lib", "lib32", "lib64":
			if b := path.Join(path.Dir(d), "bin"); !slices.Contains(dirs, b) {
				dirs = append(dirs, b)
			}
		}
	}
	return dirs
}

// binary adds the program name: the first executable ELF file found on the
// binary directories, else the first executable file (a driver on its own
// file system may have a wrapper script in /usr/bin and the program itself
// beside its libraries).
func (c *collector) binary(cp Capability, name string) {
	var script *File
	for _, d := range c.binDirs() {
		p := path.Join(d, name)
		resolved, err := resolve(c.d.root, p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			c.warn("%s: %v", p, err)
			continue
		}
		src := c.d.hostPath(resolved)
		fi, err := os.Lstat(src)
		if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
			c.warn("%s: %s is not an executable file", p, resolved)
			continue
		}
		f := File{Path: BinDir + "/" + name, Source: src, Capability: cp}
		if isELF(src) {
			c.addFile(f)
			return
		}
		if script == nil {
			script = &f
		}
	}
	if script != nil {
		c.addFile(*script)
	}
}

// isELF reports whether the file at p starts with the ELF magic.
func isELF(p string) bool {
	f, err := os.Open(p)
	if err != nil {
		return false
	}
	defer f.Close()
	b := make([]byte, len(elf.ELFMAG))
	_, err = io.ReadFull(f, b)
	return err == nil && string(b) == elf.ELFMAG
}

// addFile adds f unless its path is taken; the first file for a path (the
// linker's preferred one) wins.
func (c *collector) addFile(f File) bool {
	if prev, ok := c.seen[f.Path]; ok {
		if prev != f.Source {
			c.warn("%s: %s ignored, %s came first", f.Path, f.Source, prev)
		}
		return false
	}
	c.seen[f.Path] = f.Source
	c.out.Files = append(c.out.Files, f)
	return true
}

func (c *collector) addLink(l Link) {
	if _, ok := c.seen[l.Path]; ok {
		return
	}
	c.seen[l.Path] = "-> " + l.Target
	c.out.Links = append(c.out.Links, l)
}

// addCudaLinks adds libcuda.so -> libcuda.so.1 where libcuda.so.1 is.
func (c *collector) addCudaLinks() {
	for _, dir := range []string{LibDir, Lib64Dir} {
		if _, ok := c.seen[dir+"/libcuda.so.1"]; ok {
			c.addLink(Link{Path: dir + "/libcuda.so", Target: "libcuda.so.1"})
		}
	}
}
