package volume

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/binary"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"
	"time"
)

// makeNoteELF returns a minimal 64-bit ELF file with one SHT_NOTE section,
// .note.cuda.fwd_compatibility, holding a note of owner with desc.
func makeNoteELF(owner, desc string) []byte {
	le := binary.LittleEndian
	pad := func(b []byte) []byte {
		for len(b)%4 != 0 {
			b = append(b, 0)
		}
		return b
	}
	note := make([]byte, 12)
	le.PutUint32(note[0:], uint32(len(owner)+1))
	le.PutUint32(note[4:], uint32(len(desc)))
	le.PutUint32(note[8:], 1)
	note = append(note, pad(append([]byte(owner), 0))...)
	note = append(note, pad([]byte(desc))...)
	shstr := []byte("\x00" + compatNote + "\x00.shstrtab\x00")
	const ehsize, shentsize = 64, 64
	noteOff := ehsize
	shstrOff := noteOff + len(note)
	shOff := (shstrOff + len(shstr) + 7) &^ 7
	out := make([]byte, shOff+3*shentsize)
	copy(out, elf.ELFMAG)
	out[elf.EI_CLASS], out[elf.EI_DATA], out[elf.EI_VERSION] = byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), byte(elf.EV_CURRENT)
	le.PutUint16(out[16:], uint16(elf.ET_DYN))
	le.PutUint16(out[18:], uint16(elf.EM_X86_64))
	le.PutUint32(out[20:], uint32(elf.EV_CURRENT))
	le.PutUint64(out[40:], uint64(shOff))
	le.PutUint16(out[52:], ehsize)
	le.PutUint16(out[58:], shentsize)
	le.PutUint16(out[60:], 3)
	le.PutUint16(out[62:], 2)
	copy(out[noteOff:], note)
	copy(out[shstrOff:], shstr)
	section := func(i int, name uint32, typ elf.SectionType, off, size, align int) {
		b := out[shOff+i*shentsize:]
		le.PutUint32(b[0:], name)
		le.PutUint32(b[4:], uint32(typ))
		le.PutUint64(b[24:], uint64(off))
		le.PutUint64(b[32:], uint64(size))
		le.PutUint64(b[48:], uint64(align))
	}
	section(1, 1, elf.SHT_NOTE, noteOff, len(note), 4)
	section(2, uint32(2+len(compatNote)), elf.SHT_STRTAB, shstrOff, len(shstr), 1)
	return out
}

func TestDecideCompat(t *testing.T) {
	noNote := makeELF(elf.ELFCLASS64, "libcuda.so.1")
	note := func(branches string) []byte {
		return makeNoteELF("NVIDIA Corporation", `{"Format":1,"CUDA Version":"13.0","Driver":[`+branches+`],"Device":[1,2]}`)
	}
	lib := func(v string, b []byte) fstest.MapFS {
		return fstest.MapFS{"libcuda.so.1": {Data: []byte("link")}, "libcuda.so." + v: {Data: b}}
	}
	tests := []struct {
		name    string
		files   fstest.MapFS
		driver  string
		use     bool
		library string
		reason  string
	}{
		{"empty directory", fstest.MapFS{}, "535.309.01", false, "", "no libcuda"},
		{"h100: older compat of the same branch", lib("580.95.05", note("535,550,570,575,580")), "580.159.04", false, "libcuda.so.580.95.05", "not newer"},
		{"equal version", lib("535.309.01", noNote), "535.309.01", false, "libcuda.so.535.309.01", "not newer"},
		{"no note: newer branch", lib("580.95.05", noNote), "535.309.01", true, "libcuda.so.580.95.05", "newer branch"},
		{"no note: newer of the same branch", lib("535.400.01", noNote), "535.309.01", false, "libcuda.so.535.400.01", "no .note.cuda.fwd_compatibility"},
		{"note names the branch", lib("580.95.05", note("535,550,570,575,580")), "535.309.01", true, "libcuda.so.580.95.05", "made for branch 535"},
		{"note lacks the branch", lib("580.95.05", note("550,570,575,580")), "545.29.06", false, "libcuda.so.580.95.05", "not made for branch 545"},
		{"note without branches", lib("580.95.05", makeNoteELF("NVIDIA Corporation", `{"Format":1}`)), "535.309.01", false, "libcuda.so.580.95.05", "not made for branch"},
		{"note of another owner", lib("580.95.05", makeNoteELF("GNU", `{"Driver":[535]}`)), "535.309.01", false, "libcuda.so.580.95.05", "without an NVIDIA Corporation entry"},
		{"garbage note", lib("580.95.05", makeNoteELF("NVIDIA Corporation", `{"Driver":`)), "535.309.01", false, "libcuda.so.580.95.05", "note"},
		{"not an elf file", lib("580.95.05", []byte("text")), "535.309.01", false, "libcuda.so.580.95.05", "libcuda.so.580.95.05:"},
		{"newest of several", fstest.MapFS{"libcuda.so.570.1.1": {Data: noNote}, "libcuda.so.580.95.05": {Data: note("535")}}, "535.309.01", true, "libcuda.so.580.95.05", "made for branch"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := DecideCompat(tt.files, tt.driver)
			if err != nil {
				t.Fatal(err)
			}
			if c.Use != tt.use || c.Library != tt.library || !strings.Contains(c.Reason, tt.reason) {
				t.Fatalf("DecideCompat = %+v; want use %v, library %q, reason with %q", c, tt.use, tt.library, tt.reason)
			}
		})
	}
}

func TestDecideCompatInvalidDriver(t *testing.T) {
	if _, err := DecideCompat(fstest.MapFS{}, "../5"); !errors.Is(err, ErrInvalidVersion) {
		t.Fatalf("DecideCompat = %v, want ErrInvalidVersion", err)
	}
	if _, err := CompatFor(context.Background(), "", "5 35", nil); !errors.Is(err, ErrInvalidVersion) {
		t.Fatalf("CompatFor = %v, want ErrInvalidVersion", err)
	}
}

func TestCompatFor(t *testing.T) {
	note := makeNoteELF("NVIDIA Corporation", `{"Driver":[535,580]}`)
	rootfs := t.TempDir()
	dir := filepath.Join(rootfs, "usr/local/cuda/compat")
	must(t, os.MkdirAll(dir, 0o755))
	must(t, os.WriteFile(filepath.Join(dir, "libcuda.so.580.95.05"), note, 0o644))
	// CUDA images: /usr/local/cuda is an absolute link, resolved in the image.
	linked := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(linked, "usr/local/cuda-12.2/compat"), 0o755))
	must(t, os.WriteFile(filepath.Join(linked, "usr/local/cuda-12.2/compat/libcuda.so.580.95.05"), note, 0o644))
	must(t, os.Symlink("/usr/local/cuda-12.2", filepath.Join(linked, "usr/local/cuda")))
	// An image whose compat directory links to a host folder holding a
	// compat library: the host folder is not read.
	host := t.TempDir()
	must(t, os.WriteFile(filepath.Join(host, "libcuda.so.580.95.05"), note, 0o644))
	escape := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(escape, "usr/local/cuda"), 0o755))
	must(t, os.Symlink(host, filepath.Join(escape, "usr/local/cuda/compat")))
	// The library by a link's name: refused, not followed.
	symlinked := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(symlinked, "usr/local/cuda/compat"), 0o755))
	must(t, os.Symlink(filepath.Join(host, "libcuda.so.580.95.05"), filepath.Join(symlinked, "usr/local/cuda/compat/libcuda.so.580.95.05")))
	tests := []struct {
		name, rootfs, driver string
		use                  bool
		reason               string
	}{
		{"docker image: no root file system", "", "535.309.01", false, "no root file system"},
		{"image without compat", t.TempDir(), "535.309.01", false, "no compat directory"},
		{"newer compat of the branch", rootfs, "535.309.01", true, "made for branch 535"},
		{"older than the driver", rootfs, "580.159.04", false, "not newer"},
		{"through an absolute link in the image", linked, "535.309.01", true, "made for branch 535"},
		{"compat links to a host folder", escape, "535.309.01", false, "no compat directory"},
		{"library is a link", symlinked, "535.309.01", false, "not a regular file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := CompatFor(context.Background(), tt.rootfs, tt.driver, nil)
			if err != nil || c.Use != tt.use || !strings.Contains(c.Reason, tt.reason) {
				t.Fatalf("CompatFor = %+v, %v; want use %v, reason with %q", c, err, tt.use, tt.reason)
			}
		})
	}
	t.Run("context ended", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if c, err := CompatFor(ctx, rootfs, "535.309.01", nil); !errors.Is(err, context.Canceled) || c.Use {
			t.Fatalf("CompatFor = %+v, %v; want context.Canceled", c, err)
		}
	})
}

// TestCompatForSpecialFiles: a FIFO or a character device by the compat
// library's name is ignored with a log line, never opened: the decision
// comes back at once (a FIFO opened for reading would block).
func TestCompatForSpecialFiles(t *testing.T) {
	for _, kind := range []string{"fifo", "char device"} {
		t.Run(kind, func(t *testing.T) {
			rootfs := t.TempDir()
			dir := filepath.Join(rootfs, "usr/local/cuda/compat")
			must(t, os.MkdirAll(dir, 0o755))
			lib := filepath.Join(dir, "libcuda.so.580.95.05")
			switch kind {
			case "fifo":
				must(t, mkfifo(lib))
			default:
				if os.Geteuid() != 0 {
					t.Skip("mknod needs root")
				}
				must(t, mknodNull(lib))
			}
			var log bytes.Buffer
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c, err := CompatFor(ctx, rootfs, "535.309.01", slog.New(slog.NewTextHandler(&log, nil)))
			if err != nil || c.Use || !strings.Contains(c.Reason, "not a regular file") {
				t.Fatalf("CompatFor = %+v, %v; want no compat, the library not a regular file", c, err)
			}
			if !strings.Contains(log.String(), "image file ignored") || !strings.Contains(log.String(), "libcuda.so.580.95.05") {
				t.Errorf("log %q: want the ignored file", log.String())
			}
		})
	}
}
