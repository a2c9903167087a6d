package vmtest

import (
	"bufio"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// Archive is an initramfs being assembled: a cpio archive in the kernel's
// "newc" format, written by WriteTo. Paths are absolute inside the archive;
// a file's parent directories must be added before it (AddTree does so).
type Archive struct {
	entries []entry
	seen    map[string]bool
}

type entry struct {
	name         string // without the leading slash
	mode         uint32 // type and permission bits, as stat(2) has them
	data         []byte // a file's contents, or a link's target
	major, minor uint32 // a device node's numbers
}

// File types in a cpio header's mode.
const (
	modeDir     = 0o040000
	modeFile    = 0o100000
	modeSymlink = 0o120000
	modeChar    = 0o020000
)

func (a *Archive) add(e entry) error {
	clean := path.Clean("/" + e.name)
	if clean == "/" || clean != "/"+strings.TrimPrefix(e.name, "/") {
		return fmt.Errorf("initramfs entry %q: want a clean absolute path", e.name)
	}
	if a.seen == nil {
		a.seen = map[string]bool{}
	}
	if a.seen[clean] {
		return fmt.Errorf("initramfs entry %s: %w", clean, fs.ErrExist)
	}
	a.seen[clean] = true
	e.name = clean[1:]
	a.entries = append(a.entries, e)
	return nil
}

// Dir adds a directory.
func (a *Archive) Dir(name string, perm fs.FileMode) error {
	return a.add(entry{name: name, mode: modeDir | uint32(perm.Perm())})
}

// File adds a regular file holding data.
func (a *Archive) File(name string, perm fs.FileMode, data []byte) error {
	return a.add(entry{name: name, mode: modeFile | uint32(perm.Perm()), data: data})
}

// Symlink adds a symbolic link to target.
func (a *Archive) Symlink(name, target string) error {
	return a.add(entry{name: name, mode: modeSymlink | 0o777, data: []byte(target)})
}

// CharDevice adds a character device node.
func (a *Archive) CharDevice(name string, perm fs.FileMode, major, minor uint32) error {
	return a.add(entry{name: name, mode: modeChar | uint32(perm.Perm()), major: major, minor: minor})
}

// Has reports whether name was added.
func (a *Archive) Has(name string) bool { return a.seen[path.Clean("/"+name)] }

// Parents adds the directories above name (mode 0755) that are not there yet.
func (a *Archive) Parents(name string) error {
	var dirs []string
	for d := path.Dir(path.Clean("/" + name)); d != "/"; d = path.Dir(d) {
		dirs = append(dirs, d)
	}
	for _, d := range slices.Backward(dirs) {
		if !a.Has(d) {
			if err := a.Dir(d, 0o755); err != nil {
				return err
			}
		}
	}
	return nil
}

// AddTree adds the host directory src at dst with everything under it:
// directories, regular files and symbolic links (as links, whatever they
// point to). Other files (sockets, devices, pipes) and files root cannot
// read are left out: skip lists them, for the caller to report.
func (a *Archive) AddTree(src, dst string) (skipped []string, err error) {
	if err := a.Parents(dst); err != nil {
		return nil, err
	}
	err = filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == src {
				return err
			}
			skipped = append(skipped, p)
			if d != nil && d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		rel, _ := filepath.Rel(src, p)
		name := path.Join(dst, filepath.ToSlash(rel))
		info, err := d.Info()
		if err != nil {
			skipped = append(skipped, p)
			return nil
		}
		switch {
		case d.IsDir():
			if a.Has(name) {
				return nil
			}
			return a.Dir(name, info.Mode())
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				skipped = append(skipped, p)
				return nil
			}
			return a.Symlink(name, target)
		case d.Type().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				skipped = append(skipped, p)
				return nil
			}
			return a.File(name, info.Mode(), b)
		default:
			skipped = append(skipped, p)
			return nil
		}
	})
	return skipped, err
}

// WriteTo writes the archive: each entry in the order added, then the
// trailer. Every entry has its own inode number, so hard links are never
// implied.
func (a *Archive) WriteTo(w io.Writer) (int64, error) {
	cw := &countWriter{w: bufio.NewWriterSize(w, 1<<20)}
	for i, e := range a.entries {
		writeEntry(cw, uint32(i+1), e)
	}
	writeEntry(cw, 0, entry{name: "TRAILER!!!"})
	if cw.err == nil {
		cw.err = cw.w.(*bufio.Writer).Flush()
	}
	return cw.n, cw.err
}

// writeEntry writes one newc header, the name and the data, each padded to
// four bytes.
func writeEntry(w *countWriter, ino uint32, e entry) {
	nlink := uint32(1)
	if e.mode&0o170000 == modeDir {
		nlink = 2
	}
	name := e.name + "\x00"
	fmt.Fprintf(w, "070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		ino, e.mode, 0, 0, nlink, 0, len(e.data), 0, 0, e.major, e.minor, len(name), 0)
	io.WriteString(w, name)
	w.pad()
	w.Write(e.data)
	w.pad()
}

// countWriter counts what it writes and keeps the first error.
type countWriter struct {
	w   io.Writer
	n   int64
	err error
}

func (c *countWriter) Write(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	n, err := c.w.Write(p)
	c.n += int64(n)
	c.err = err
	return n, err
}

func (c *countWriter) pad() {
	if r := c.n % 4; r != 0 {
		c.Write(make([]byte, 4-r))
	}
}
