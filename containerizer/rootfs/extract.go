package rootfs

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
)

// blockSize is the unit in which runs of zeros become holes.
const blockSize = 4096

// extractor writes tar streams under a root, within limits. Its budgets
// are spent over every stream it extracts.
type extractor struct {
	root    *os.Root
	limits  Limits
	bytes   int64 // file content written so far, holes included
	entries int64 // tar entries read so far
	owner   bool  // keep the entries' ownership (when running as root)
	// modes holds the directories' modes, set once every layer is in:
	// until then the directories stay writable, so that a layer can fill
	// them and an error can remove them. Nil in a scratch directory.
	modes map[string]fs.FileMode
	buf   []byte
	zero  []byte
}

// newExtractor opens dir. An image's root (image true) gets the entries'
// modes and, when running as root, their ownership; a scratch directory
// gets neither.
func newExtractor(dir string, l Limits, image bool) (*extractor, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	x := &extractor{root: root, limits: l, buf: make([]byte, 32*blockSize), zero: make([]byte, blockSize)}
	if image {
		x.owner = os.Geteuid() == 0
		x.modes = map[string]fs.FileMode{}
	}
	return x, nil
}

func (x *extractor) close() error { return x.root.Close() }

// layerState is what one layer wrote, for its opaque directories.
type layerState struct {
	created map[string]bool // paths this layer wrote
	parents map[string]bool // their ancestors
	opaque  []string        // directories whose lower content is hidden
}

func (s *layerState) add(p string) {
	s.created[p] = true
	for d := path.Dir(p); d != "." && !s.parents[d]; d = path.Dir(d) {
		s.parents[d] = true
	}
}

// extract writes the tar r under the root. With whiteouts, ".wh." entries
// remove what lower layers wrote.
func (x *extractor) extract(ctx context.Context, r io.Reader, whiteouts bool) error {
	st := &layerState{created: map[string]bool{}, parents: map[string]bool{}}
	tr := tar.NewReader(r)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return readError(err)
		}
		if x.entries++; x.entries > x.limits.Entries {
			return &LimitError{Limit: "entries", Max: x.limits.Entries}
		}
		name, ok := entryName(hdr.Name)
		if !ok {
			return fmt.Errorf("%.200q: climbs out of the root or is too long: %w", hdr.Name, ErrUnsafe)
		}
		if name == "" {
			continue
		}
		if hdr.Typeflag == tar.TypeSymlink && len(hdr.Linkname) > maxName {
			return fmt.Errorf("%.200q: link longer than %d bytes: %w", name, maxName, ErrUnsafe)
		}
		if err := x.entry(ctx, tr, hdr, name, whiteouts, st); err != nil {
			return fmt.Errorf("%.200q: %w", name, err)
		}
	}
	for _, d := range st.opaque {
		if err := x.hideLower(d, st); err != nil {
			return err
		}
	}
	return nil
}

// entry applies one tar entry, whose name is a clean path in the root.
func (x *extractor) entry(ctx context.Context, tr *tar.Reader, hdr *tar.Header, name string, whiteouts bool, st *layerState) error {
	target, err := resolveParent(x.root, name)
	if err != nil {
		return err
	}
	dir, base := path.Split(target)
	if whiteouts && strings.HasPrefix(base, ".wh.") {
		switch victim := base[len(".wh."):]; {
		case victim == ".wh..opq":
			st.opaque = append(st.opaque, path.Clean(dir))
			return nil
		case strings.HasPrefix(victim, ".wh."):
			return nil // other aufs metadata
		case victim == "" || victim == "." || victim == "..":
			return fmt.Errorf("whiteout of %q: %w", victim, ErrUnsafe)
		default:
			p := path.Join(dir, victim)
			delete(x.modes, p)
			return x.root.RemoveAll(p)
		}
	}
	if hdr.Typeflag == tar.TypeReg || hdr.Typeflag == tar.TypeGNUSparse {
		if hdr.Size > x.limits.Bytes-x.bytes {
			return &LimitError{Limit: "bytes", Max: x.limits.Bytes}
		}
		x.bytes += hdr.Size
	}
	if dir != "" {
		if err := x.root.MkdirAll(path.Clean(dir), 0o755); err != nil {
			return err
		}
	}
	made, err := x.write(ctx, tr, hdr, target)
	if err != nil || !made {
		return err
	}
	st.add(target)
	if x.owner {
		if err := x.root.Lchown(target, hdr.Uid, hdr.Gid); err != nil {
			return err
		}
	}
	mode := hdr.FileInfo().Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
	switch hdr.Typeflag {
	case tar.TypeDir:
		if x.modes != nil {
			x.modes[target] = mode
		}
	case tar.TypeReg, tar.TypeGNUSparse:
		// After Lchown, which clears the set-id bits.
		if x.modes != nil {
			return x.root.Chmod(target, mode)
		}
	}
	return nil
}

// write creates the entry at target, a path whose parent holds no symlink,
// replacing what was there; it reports whether it made anything.
func (x *extractor) write(ctx context.Context, tr *tar.Reader, hdr *tar.Header, target string) (bool, error) {
	switch hdr.Typeflag {
	case tar.TypeDir, tar.TypeReg, tar.TypeGNUSparse, tar.TypeSymlink, tar.TypeLink:
	default:
		return false, nil // device nodes and fifos: a native container has its own /dev
	}
	if hdr.Typeflag == tar.TypeDir {
		if fi, err := x.root.Lstat(target); err == nil && fi.IsDir() {
			return true, nil
		}
	}
	var link string
	if hdr.Typeflag == tar.TypeLink {
		// The file linked to must be one this image put in the root: a
		// regular file, named inside the root.
		n, ok := entryName(hdr.Linkname)
		if !ok || n == "" {
			return false, fmt.Errorf("hard link to %.200q: %w", hdr.Linkname, ErrUnsafe)
		}
		p, err := resolveParent(x.root, n)
		if err != nil {
			return false, err
		}
		if fi, err := x.root.Lstat(p); err != nil || !fi.Mode().IsRegular() {
			return false, fmt.Errorf("hard link to %.200q: not a regular file of the image: %w", hdr.Linkname, ErrUnsafe)
		}
		if p == target {
			return true, nil
		}
		link = p
	}
	if err := x.root.RemoveAll(target); err != nil {
		return false, err
	}
	delete(x.modes, target)
	switch hdr.Typeflag {
	case tar.TypeDir:
		return true, x.root.Mkdir(target, 0o755)
	case tar.TypeSymlink:
		return true, x.root.Symlink(hdr.Linkname, target)
	case tar.TypeLink:
		return true, x.root.Link(link, target)
	}
	f, err := x.root.OpenFile(target, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return false, err
	}
	err = x.copy(ctx, f, tr)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return true, err
}

// copy writes r to f, leaving holes where whole blocks are zero: a sparse
// entry stays sparse, and so does a run of zeros in a dense one.
func (x *extractor) copy(ctx context.Context, f *os.File, r io.Reader) error {
	var off int64
	for {
		n, rerr := fill(r, x.buf)
		for i := 0; i < n; {
			j := min(i+blockSize, n)
			if bytes.Equal(x.buf[i:j], x.zero[:j-i]) {
				i = j
				continue
			}
			for j < n {
				k := min(j+blockSize, n)
				if bytes.Equal(x.buf[j:k], x.zero[:k-j]) {
					break
				}
				j = k
			}
			if _, err := f.WriteAt(x.buf[i:j], off+int64(i)); err != nil {
				return err
			}
			i = j
		}
		off += int64(n)
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return readError(rerr)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	return f.Truncate(off)
}

// fill reads r into buf until buf is full (nil error) or r ends (io.EOF)
// or fails.
func fill(r io.Reader, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := r.Read(buf[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// hideLower removes from dir what this layer did not write: the lower
// layers' content of an opaque directory.
func (x *extractor) hideLower(dir string, st *layerState) error {
	if fi, err := x.root.Lstat(dir); err != nil || !fi.IsDir() {
		return nil // gone, or replaced by a file or a symlink since
	}
	f, err := x.root.Open(dir)
	if err != nil {
		return err
	}
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return err
	}
	for _, n := range names {
		p := path.Join(dir, n)
		switch {
		case !st.created[p] && !st.parents[p]:
			delete(x.modes, p)
			if err := x.root.RemoveAll(p); err != nil {
				return err
			}
		case st.parents[p]:
			if err := x.hideLower(p, st); err != nil {
				return err
			}
		}
	}
	return nil
}

// setModes gives the directories their modes, deepest first, so that
// each is still searchable when its children are set.
func (x *extractor) setModes() error {
	dirs := make([]string, 0, len(x.modes))
	for d := range x.modes {
		dirs = append(dirs, d)
	}
	slices.Sort(dirs)
	slices.Reverse(dirs)
	for _, d := range dirs {
		if fi, err := x.root.Lstat(d); err != nil || !fi.IsDir() {
			continue
		}
		if err := x.root.Chmod(d, x.modes[d]); err != nil {
			return fmt.Errorf("%q: %w", d, err)
		}
	}
	return nil
}
