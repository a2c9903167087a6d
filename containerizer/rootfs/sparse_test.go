package rootfs

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
)

// paxSparse writes, as archive/tar cannot, a PAX 1.0 sparse entry: name,
// size bytes long, all holes but data at offset.
func paxSparse(t testing.TB, name string, size, offset int64, data string) []byte {
	t.Helper()
	var recs string
	for _, kv := range [][2]string{
		{"GNU.sparse.major", "1"}, {"GNU.sparse.minor", "0"},
		{"GNU.sparse.name", name}, {"GNU.sparse.realsize", fmt.Sprint(size)},
	} {
		r := " " + kv[0] + "=" + kv[1] + "\n"
		n := len(r) + 1
		for len(fmt.Sprint(n))+len(r) != n {
			n++
		}
		recs += fmt.Sprint(n) + r
	}
	// The extended header: written as a plain file, then retyped.
	var x bytes.Buffer
	tw := tar.NewWriter(&x)
	tw.WriteHeader(&tar.Header{Name: "PaxHeaders/" + name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(recs)), Format: tar.FormatUSTAR})
	tw.Write([]byte(recs))
	tw.Flush()
	b := x.Bytes()
	b[156] = tar.TypeXHeader
	copy(b[148:156], "        ")
	sum := 0
	for _, c := range b[:512] {
		sum += int(c)
	}
	copy(b[148:156], fmt.Sprintf("%06o\x00 ", sum))
	// The entry: its sparse map, in a block of its own, then its data.
	m := []byte(fmt.Sprintf("1\n%d\n%d\n", offset, len(data)))
	m = append(m, make([]byte, 512-len(m))...)
	body := append(m, data...)
	return append(b, tarOf(t, ent{h: tar.Header{Name: "GNUSparseFile.0/" + name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body))}, body: body})...)
}

// gnuSparse has GNU tar write a file of size bytes, all holes but data at
// offset, in its own (old GNU) sparse format.
func gnuSparse(t *testing.T, name string, size, offset int64, data string) []byte {
	t.Helper()
	tarCmd, err := exec.LookPath("tar")
	if err != nil {
		t.Skip("no tar command")
	}
	dir := t.TempDir()
	f, err := os.Create(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte(data), offset)
	f.Truncate(size)
	f.Close()
	out := filepath.Join(t.TempDir(), "layer.tar")
	if b, err := exec.Command(tarCmd, "--sparse", "--format=gnu", "-cf", out, "-C", dir, name).CombinedOutput(); err != nil {
		t.Skipf("tar --sparse: %v: %s", err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A 2 GiB sparse entry is unpacked as a 2 GiB file that takes next to no
// disk; so is a run of zeros in a dense one.
func TestUnpackSparse(t *testing.T) {
	const size, offset, data = 2 << 30, 1 << 30, "hello"
	for _, tc := range []struct {
		name  string
		layer func(t *testing.T) []byte
		size  int64
	}{
		{name: "pax sparse", layer: func(t *testing.T) []byte { return paxSparse(t, "big", size, offset, data) }, size: size},
		{name: "pax sparse, gzip", layer: func(t *testing.T) []byte { return gz(t, paxSparse(t, "big", size, offset, data)) }, size: size},
		{name: "gnu sparse", layer: func(t *testing.T) []byte { return gnuSparse(t, "big", size, offset, data) }, size: size},
		{name: "dense zeros", layer: func(t *testing.T) []byte {
			b := make([]byte, 8<<20)
			copy(b[4<<20:], data)
			return tarOf(t, ent{h: tar.Header{Name: "big", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(b))}, body: b})
		}, size: 8 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst := filepath.Join(t.TempDir(), "rootfs")
			if _, err := Unpack(context.Background(), saveTar(t, tc.layer(t)), dst); err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(dst, "big")
			var st syscall.Stat_t
			if err := syscall.Stat(p, &st); err != nil {
				t.Fatal(err)
			}
			if st.Size != tc.size || st.Blocks*512 > 1<<20 {
				t.Errorf("big: %d bytes in %d blocks, want %d bytes in next to none", st.Size, st.Blocks, tc.size)
			}
			f, _ := os.Open(p)
			defer f.Close()
			got := make([]byte, len(data)+2)
			at := int64(offset)
			if tc.size < size {
				at = 4 << 20
			}
			f.ReadAt(got, at-1)
			if want := "\x00" + data + "\x00"; string(got) != want {
				t.Errorf("big holds %q around its data, want %q", got, want)
			}
		})
	}
}

// Directories get their modes once every layer is in, so that a
// read-only directory can still be filled by its entries (and removed on
// error) when not running as root; set-id bits are kept.
func TestUnpackModes(t *testing.T) {
	ro := dir("ro/")
	ro.h.Mode = 0o555
	su := reg("bin/su", "x")
	su.h.Mode = 0o4755
	src := saveTar(t, tarOf(t, ro, reg("ro/f", "x"), su), tarOf(t, reg("ro/g", "y")))
	dst := filepath.Join(t.TempDir(), "rootfs")
	if _, err := Unpack(context.Background(), src, dst); err != nil {
		t.Fatal(err)
	}
	defer removeTree(dst)
	for p, want := range map[string]fs.FileMode{"ro": fs.ModeDir | 0o555, "ro/f": 0o644, "ro/g": 0o644, "bin/su": fs.ModeSetuid | 0o755} {
		if fi, err := os.Lstat(filepath.Join(dst, p)); err != nil || fi.Mode() != want {
			t.Errorf("%s: %v, %v; want mode %v", p, fi.Mode(), err, want)
		}
	}
	// A refusal after a read-only directory still removes everything.
	src = saveTar(t, tarOf(t, ro, reg("ro/f", "x")), tarOf(t, reg("../x", "y")))
	base := t.TempDir()
	if _, err := Unpack(context.Background(), src, filepath.Join(base, "rootfs")); err == nil {
		t.Fatal("Unpack accepted ../x")
	}
	if got := listTree(t, base); len(got) > 0 {
		t.Errorf("left behind: %q", got)
	}
}
