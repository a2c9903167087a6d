package volume

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/node"
)

// compatNote is the ELF section of a forward-compatibility libcuda that
// names the driver branches it is made for.
const compatNote = ".note.cuda.fwd_compatibility"

// maxCompatNote bounds the note read from an image's file.
const maxCompatNote = 64 << 10

// Compat is the decision on CUDA forward compatibility for one container:
// whether CUDACompat goes first in its LD_LIBRARY_PATH.
type Compat struct {
	// Use is true when the compat libcuda is newer than the driver and
	// made for its branch.
	Use bool
	// Library is the compat libcuda's file name ("" when none).
	Library string
	// Branches are the driver branches its ELF note names (none without
	// a note).
	Branches []int
	// Reason says why, for reports.
	Reason string
}

// DecideCompat decides from the files of an image's compat directory
// (/usr/local/cuda/compat, as an fs.FS) whether a container with the given
// host driver version must use them. It uses the newest
// libcuda.so.<version> there when that version is newer than the driver and
// made for the driver's branch: the branch is listed in the file's
// .note.cuda.fwd_compatibility ELF note, or, without a note, the file's
// major version is above the driver's. A missing directory or an unreadable
// file means no; only an invalid driver version is an error.
func DecideCompat(compat fs.FS, driver string) (Compat, error) {
	if err := ValidateVersion(driver); err != nil {
		return Compat{}, err
	}
	entries, err := fs.ReadDir(compat, ".")
	if err != nil {
		return Compat{Reason: fmt.Sprintf("no compat directory: %v", err)}, nil
	}
	best := ""
	for _, e := range entries {
		v, ok := strings.CutPrefix(e.Name(), "libcuda.so.")
		if ok && strings.Contains(v, ".") && ValidateVersion(v) == nil && (best == "" || node.CompareVersions(v, best) > 0) {
			best = v
		}
	}
	if best == "" {
		return Compat{Reason: "no libcuda.so.<version> in the compat directory"}, nil
	}
	d := Compat{Library: "libcuda.so." + best}
	if node.CompareVersions(best, driver) <= 0 {
		d.Reason = fmt.Sprintf("%s is not newer than driver %s", d.Library, driver)
		return d, nil
	}
	major := func(v string) int { n, _ := strconv.Atoi(strings.SplitN(v, ".", 2)[0]); return n }
	branches, err := readCompatNote(compat, d.Library)
	switch {
	case err != nil:
		d.Reason = fmt.Sprintf("%s: %v", d.Library, err)
	case branches == nil && major(best) > major(driver):
		d.Use, d.Reason = true, fmt.Sprintf("%s is of a newer branch than driver %s", d.Library, driver)
	case branches == nil:
		d.Reason = fmt.Sprintf("%s has no %s note and is of driver %s's branch", d.Library, compatNote, driver)
	case slices.Contains(branches, major(driver)):
		d.Use, d.Branches = true, branches
		d.Reason = fmt.Sprintf("%s is newer than driver %s and made for branch %d", d.Library, driver, major(driver))
	default:
		d.Branches = branches
		d.Reason = fmt.Sprintf("%s is not made for branch %d (only %v)", d.Library, major(driver), branches)
	}
	return d, nil
}

// maxCompatEntries bounds the entries of an image's compat directory read.
const maxCompatEntries = 4096

// CompatFor decides for a container whose root file system is at rootfs
// on this host. Without one (rootfs is ""; a Docker image's files are not
// reachable), the answer is no: compat is never put first unchecked.
//
// The image's files are read as the container would find them, never on
// the host: every symbolic link is resolved inside rootfs (a compat
// directory that links to a host folder leads to that path in the image),
// the library itself must be a regular file (a FIFO, a device or a link by
// its name is ignored, never opened, and logged on log), reads are
// bounded (at most 4096 directory entries; the ELF headers and a note of at
// most 64 KiB) and abandoned when ctx ends, which is then the error. log
// may be nil.
func CompatFor(ctx context.Context, rootfs, driver string, log *slog.Logger) (Compat, error) {
	if err := ValidateVersion(driver); err != nil {
		return Compat{}, err
	}
	if rootfs == "" {
		return Compat{Reason: "no root file system to read the compat libraries from"}, nil
	}
	if err := context.Cause(ctx); err != nil {
		return Compat{}, fmt.Errorf("read the image's %s: %w", CUDACompat, err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	type result struct {
		c   Compat
		err error
	}
	done := make(chan result, 1)
	go func() {
		c, err := DecideCompat(inRootFS{root: rootfs, dir: CUDACompat, log: log}, driver)
		done <- result{c, err}
	}()
	select {
	case r := <-done:
		return r.c, r.err
	case <-ctx.Done():
		return Compat{}, fmt.Errorf("read the image's %s: %w", CUDACompat, context.Cause(ctx))
	}
}

// inRootFS is a directory of an image's root file system, read as
// linux.OpenFileInRoot reads it: links resolved inside the root, regular
// files only.
type inRootFS struct {
	root, dir string
	log       *slog.Logger
}

// Open opens a regular file of the directory; anything else is an error,
// logged.
func (f inRootFS) Open(name string) (fs.File, error) {
	if !fs.ValidPath(name) {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrInvalid}
	}
	p := path.Join(f.dir, name)
	file, err := linux.OpenFileInRoot(f.root, p)
	if errors.Is(err, linux.ErrNotRegular) {
		f.log.Warn("image file ignored", "file", p, "err", err)
	}
	if err != nil {
		return nil, err
	}
	return file, nil
}

// ReadDir lists a directory, at most maxCompatEntries entries.
func (f inRootFS) ReadDir(name string) ([]fs.DirEntry, error) {
	if !fs.ValidPath(name) {
		return nil, &fs.PathError{Op: "readdir", Path: name, Err: fs.ErrInvalid}
	}
	return linux.ReadDirInRoot(f.root, path.Join(f.dir, name), maxCompatEntries)
}

// readCompatNote returns the driver branches named by the file's compat
// note: nil without a note, an error when the note is malformed.
func readCompatNote(fsys fs.FS, name string) ([]int, error) {
	f, err := fsys.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	ra, ok := f.(io.ReaderAt)
	if !ok {
		b, err := io.ReadAll(f)
		if err != nil {
			return nil, err
		}
		ra = bytes.NewReader(b)
	}
	ef, err := elf.NewFile(ra)
	if err != nil {
		return nil, err
	}
	s := ef.Section(compatNote)
	if s == nil || s.Type != elf.SHT_NOTE {
		return nil, nil
	}
	if s.Size > maxCompatNote {
		return nil, fmt.Errorf("%s note of %d bytes", compatNote, s.Size)
	}
	data, err := s.Data()
	if err != nil {
		return nil, err
	}
	desc, err := noteDesc(data, ef.ByteOrder, "NVIDIA Corporation")
	if err != nil {
		return nil, err
	}
	var n struct {
		Driver []int `json:"Driver"`
	}
	if err := json.Unmarshal(desc, &n); err != nil {
		return nil, fmt.Errorf("%s note: %w", compatNote, err)
	}
	if n.Driver == nil {
		n.Driver = []int{} // a note without branches matches none
	}
	return n.Driver, nil
}

// noteDesc returns the descriptor of the first note of owner in data (an
// SHT_NOTE section: namesz, descsz, type, then name and descriptor, each
// padded to 4 bytes).
func noteDesc(data []byte, order binary.ByteOrder, owner string) ([]byte, error) {
	pad := func(n uint64) uint64 { return (n + 3) &^ 3 }
	for len(data) >= 12 {
		namesz, descsz := uint64(order.Uint32(data[0:])), uint64(order.Uint32(data[4:]))
		if 12+pad(namesz)+pad(descsz) > uint64(len(data)) {
			break
		}
		name := string(bytes.TrimRight(data[12:12+namesz], "\x00"))
		desc := data[12+pad(namesz) : 12+pad(namesz)+descsz]
		if name == owner {
			return bytes.TrimRight(desc, "\x00"), nil
		}
		data = data[12+pad(namesz)+pad(descsz):]
	}
	return nil, errors.New(compatNote + " note truncated or without an " + owner + " entry")
}
