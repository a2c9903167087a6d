package rootfs

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// ent is one tar entry: a header and, for a regular file, its body.
type ent struct {
	h    tar.Header
	body []byte
}

func reg(name, body string) ent {
	return ent{h: tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body))}, body: []byte(body)}
}

func dir(name string) ent { return ent{h: tar.Header{Name: name, Typeflag: tar.TypeDir, Mode: 0o755}} }

func symlink(name, target string) ent {
	return ent{h: tar.Header{Name: name, Typeflag: tar.TypeSymlink, Linkname: target, Mode: 0o777}}
}

func hardlink(name, target string) ent {
	return ent{h: tar.Header{Name: name, Typeflag: tar.TypeLink, Linkname: target, Mode: 0o644}}
}

// tarOf writes the entries as a tar; one whose body is shorter than its
// header says ends the archive there, truncated.
func tarOf(t testing.TB, es ...ent) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range es {
		h := e.h
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(e.body); err != nil {
			t.Fatal(err)
		}
		if int64(len(e.body)) != h.Size {
			return buf.Bytes() // a truncated archive
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func gz(t testing.TB, b []byte) []byte {
	t.Helper()
	var z bytes.Buffer
	w, _ := gzip.NewWriterLevel(&z, gzip.BestCompression)
	w.Write(b)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return z.Bytes()
}

// saveTar writes a `docker save` tar of the layers, lowest first.
func saveTar(t testing.TB, layers ...[]byte) string {
	t.Helper()
	cfg, _ := json.Marshal(config)
	files := map[string][]byte{"cfg.json": cfg}
	var names []string
	for i, l := range layers {
		n := fmt.Sprintf("l%d/layer.tar", i)
		files[n] = l
		names = append(names, n)
	}
	files["manifest.json"], _ = json.Marshal([]map[string]any{{"Config": "cfg.json", "Layers": names}})
	p := filepath.Join(t.TempDir(), "save.tar")
	writeTar(t, p, files)
	return p
}

// listTree lists the paths under dir.
func listTree(t testing.TB, dir string) []string {
	t.Helper()
	var got []string
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if rel, _ := filepath.Rel(dir, p); rel != "." {
			got = append(got, rel)
		}
		return nil
	})
	return got
}

// The hostile archives: each is refused, or confined to the root; none
// writes outside it, and a refused one leaves nothing behind.
func TestUnpackHostile(t *testing.T) {
	zeros := make([]byte, 64<<20)
	for _, tc := range []struct {
		name   string
		src    func(t *testing.T, outside string) string
		limits Limits
		want   error                                   // nil: accepted
		check  func(t *testing.T, dst, outside string) // for an accepted image
	}{
		{
			name: "traversal",
			src: func(t *testing.T, o string) string {
				return saveTar(t, tarOf(t, reg("../../../../../../"+o+"/pwned", "x")))
			},
			want: ErrUnsafe,
		},
		{
			name: "traversal inside a name",
			src:  func(t *testing.T, o string) string { return saveTar(t, tarOf(t, reg("a/../../pwned", "x"))) },
			want: ErrUnsafe,
		},
		{
			name: "absolute name lands in the root",
			src:  func(t *testing.T, o string) string { return saveTar(t, tarOf(t, reg(o+"/pwned", "x"))) },
			check: func(t *testing.T, dst, o string) {
				if b, err := os.ReadFile(filepath.Join(dst, o, "pwned")); err != nil || string(b) != "x" {
					t.Errorf("absolute name not in the root: %q, %v", b, err)
				}
			},
		},
		{
			name: "symlink then write, two layers",
			src: func(t *testing.T, o string) string {
				return saveTar(t, tarOf(t, symlink("evil", o)), tarOf(t, reg("evil/pwned", "x")))
			},
			check: func(t *testing.T, dst, o string) {
				if _, err := os.Stat(filepath.Join(dst, o, "pwned")); err != nil {
					t.Errorf("a write through an absolute symlink did not land in the root: %v", err)
				}
			},
		},
		{
			name: "symlink then write, one layer",
			src: func(t *testing.T, o string) string {
				return saveTar(t, tarOf(t, symlink("evil", o), reg("evil/pwned", "x")))
			},
		},
		{
			name: "relative symlink climbing out",
			src: func(t *testing.T, o string) string {
				return saveTar(t, tarOf(t, symlink("a/up", "../../../../../../.."+o), reg("a/up/pwned", "x")))
			},
		},
		{
			name: "symlinked parent directory",
			src: func(t *testing.T, o string) string {
				return saveTar(t, tarOf(t, symlink("d", o), dir("d/sub/"), reg("d/sub/deeper/pwned", "x")))
			},
		},
		{
			name: "file replaces a symlink to a host file",
			src: func(t *testing.T, o string) string {
				return saveTar(t, tarOf(t, symlink("x", o+"/keep")), tarOf(t, reg("x", "overwritten")))
			},
			check: func(t *testing.T, dst, o string) {
				if b, _ := os.ReadFile(filepath.Join(dst, "x")); string(b) != "overwritten" {
					t.Errorf("x holds %q", b)
				}
			},
		},
		{
			name: "hard link to a host file",
			src:  func(t *testing.T, o string) string { return saveTar(t, tarOf(t, hardlink("stolen", o+"/keep"))) },
			want: ErrUnsafe,
		},
		{
			name: "hard link climbing out",
			src: func(t *testing.T, o string) string {
				return saveTar(t, tarOf(t, hardlink("stolen", "../../../../../../.."+o+"/keep")))
			},
			want: ErrUnsafe,
		},
		{
			name: "hard link through a symlink",
			src: func(t *testing.T, o string) string {
				return saveTar(t, tarOf(t, symlink("h", o), hardlink("stolen", "h/keep")))
			},
			want: ErrUnsafe,
		},
		{
			name: "hard link to a symlink",
			src: func(t *testing.T, o string) string {
				return saveTar(t, tarOf(t, symlink("h", o+"/keep"), hardlink("stolen", "h")))
			},
			want: ErrUnsafe,
		},
		{
			name: "hard link to a directory",
			src:  func(t *testing.T, o string) string { return saveTar(t, tarOf(t, dir("d/"), hardlink("l", "d"))) },
			want: ErrUnsafe,
		},
		{
			name: "whiteout of ..",
			src: func(t *testing.T, o string) string {
				return saveTar(t, tarOf(t, reg("etc/a", "x")), tarOf(t, reg("etc/.wh...", "")))
			},
			want: ErrUnsafe,
		},
		{
			name: "whiteout of .",
			src: func(t *testing.T, o string) string {
				return saveTar(t, tarOf(t, reg("etc/a", "x")), tarOf(t, reg("etc/.wh..", "")))
			},
			want: ErrUnsafe,
		},
		{
			name: "whiteout through a symlink",
			src: func(t *testing.T, o string) string {
				return saveTar(t, tarOf(t, symlink("w", o)), tarOf(t, reg("w/.wh.keep", "")))
			},
		},
		{
			name: "opaque whiteout through a symlink",
			src: func(t *testing.T, o string) string {
				return saveTar(t, tarOf(t, symlink("w", o)), tarOf(t, reg("w/.wh..wh..opq", ""), reg("w/new", "x")))
			},
		},
		{
			name: "opaque directory replaced by a symlink to the root",
			src: func(t *testing.T, o string) string {
				return saveTar(t, tarOf(t, reg("keepme", "x"), dir("d/"), reg("d/old", "x")),
					tarOf(t, reg("d/.wh..wh..opq", ""), symlink("d", "/")))
			},
			check: func(t *testing.T, dst, o string) {
				if _, err := os.Stat(filepath.Join(dst, "keepme")); err != nil {
					t.Errorf("the opaque whiteout of d hid the root through a symlink: %v", err)
				}
			},
		},
		{
			name: "device node is skipped",
			src: func(t *testing.T, o string) string {
				return saveTar(t, tarOf(t, ent{h: tar.Header{Name: "dev/mem", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 1, Mode: 0o666}}))
			},
			check: func(t *testing.T, dst, o string) {
				if _, err := os.Lstat(filepath.Join(dst, "dev/mem")); err == nil {
					t.Error("a device node was created")
				}
			},
		},
		{
			name: "name too long",
			src: func(t *testing.T, o string) string {
				return saveTar(t, tarOf(t, reg(strings.Repeat("a/", 3000)+"x", "x")))
			},
			want: ErrUnsafe,
		},
		{
			name: "symlink loop",
			src: func(t *testing.T, o string) string {
				return saveTar(t, tarOf(t, symlink("a", "b"), symlink("b", "a"), reg("a/x", "x")))
			},
			want: ErrUnsafe,
		},
		{
			name: "symlink blow-up",
			src: func(t *testing.T, o string) string {
				return saveTar(t, tarOf(t, symlink("s", strings.Repeat("s/", 2000)), reg("s/x", "x")))
			},
			want: ErrUnsafe,
		},
		{
			name: "byte bomb",
			src: func(t *testing.T, o string) string {
				return saveTar(t, tarOf(t, reg("a", "1234"), reg("b", strings.Repeat("x", 2<<20))))
			},
			limits: Limits{Bytes: 1 << 20},
			want:   ErrLimit,
		},
		{
			name: "declared 100 GiB",
			src: func(t *testing.T, o string) string {
				b := tarOf(t, ent{h: tar.Header{Name: "a", Typeflag: tar.TypeReg, Mode: 0o644, Size: 100 << 30}})
				return saveTar(t, b)
			},
			want: ErrLimit,
		},
		{
			name: "image tar declares 100 GiB",
			src: func(t *testing.T, o string) string {
				p := filepath.Join(t.TempDir(), "save.tar")
				os.WriteFile(p, tarOf(t, ent{h: tar.Header{Name: "blob", Typeflag: tar.TypeReg, Mode: 0o644, Size: 100 << 30}}), 0o644)
				return p
			},
			want: ErrLimit,
		},
		{
			name: "gzip ratio bomb",
			src: func(t *testing.T, o string) string {
				return saveTar(t, gz(t, tarOf(t, ent{h: tar.Header{Name: "zeros", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(zeros))}, body: zeros})))
			},
			want: ErrLimit,
		},
		{
			name: "too many entries",
			src: func(t *testing.T, o string) string {
				var es []ent
				for i := range 101 {
					es = append(es, reg(fmt.Sprint("f", i), ""))
				}
				return saveTar(t, tarOf(t, es[:50]...), tarOf(t, es[50:]...))
			},
			limits: Limits{Entries: 100},
			want:   ErrLimit,
		},
		{
			name: "truncated tar",
			src: func(t *testing.T, o string) string {
				b := tarOf(t, reg("a", strings.Repeat("x", 4096)))
				return saveTar(t, b[:2048])
			},
			want: ErrFormat,
		},
		{
			name: "corrupt tar header",
			src: func(t *testing.T, o string) string {
				b := tarOf(t, reg("a", "x"), reg("b", "y"))
				b[1024+148] ^= 0x7 // the second header's checksum
				return saveTar(t, b)
			},
			want: ErrFormat,
		},
		{
			name: "truncated gzip",
			src: func(t *testing.T, o string) string {
				b := gz(t, tarOf(t, reg("a", strings.Repeat("abcdefgh", 4096))))
				return saveTar(t, b[:len(b)/2])
			},
			want: ErrFormat,
		},
		{
			name: "corrupt gzip checksum",
			src: func(t *testing.T, o string) string {
				b := gz(t, tarOf(t, reg("a", "x")))
				b[len(b)-8] ^= 0xff // the CRC-32 in the trailer
				return saveTar(t, b)
			},
			want: ErrFormat,
		},
		{
			name: "truncated image tar",
			src: func(t *testing.T, o string) string {
				p := saveTar(t, tarOf(t, reg("a", strings.Repeat("x", 8192))))
				b, _ := os.ReadFile(p)
				os.WriteFile(p, b[:len(b)/2], 0o644)
				return p
			},
			want: ErrFormat,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := t.TempDir()
			outside := filepath.Join(base, "outside")
			os.Mkdir(outside, 0o755)
			keep := filepath.Join(outside, "keep")
			os.WriteFile(keep, []byte("host"), 0o644)
			scratch := filepath.Join(base, "scratch")
			os.Mkdir(scratch, 0o755)
			dst := filepath.Join(base, "new", "rootfs")
			src := tc.src(t, outside)

			_, err := Unpack(context.Background(), src, dst, WithLimits(tc.limits), WithScratchDir(scratch))
			switch {
			case tc.want == nil && err != nil:
				t.Fatalf("Unpack = %v, want it accepted", err)
			case tc.want != nil && !errors.Is(err, tc.want):
				t.Fatalf("Unpack = %v, want %v", err, tc.want)
			case err != nil && strings.Contains(err.Error(), "\n"):
				t.Errorf("error is not one line: %q", err)
			}
			if got := listTree(t, outside); !slices.Equal(got, []string{"keep"}) {
				t.Errorf("outside the root: %q, want only keep", got)
			}
			var st syscall.Stat_t
			if b, _ := os.ReadFile(keep); string(b) != "host" || syscall.Stat(keep, &st) != nil || st.Nlink != 1 {
				t.Errorf("the host file was touched: %q, %d links", b, st.Nlink)
			}
			if got := listTree(t, scratch); len(got) > 0 {
				t.Errorf("scratch left behind: %q", got)
			}
			if err != nil {
				if _, serr := os.Lstat(filepath.Join(base, "new")); serr == nil {
					t.Errorf("a refused image left %s: %q", dst, listTree(t, filepath.Join(base, "new")))
				}
				return
			}
			if tc.check != nil {
				tc.check(t, dst, outside)
			}
		})
	}
}

// TestUnpackCleansExistingDest: when dst was there and empty, a refused
// image leaves it there and empty; a full one is not touched.
func TestUnpackCleansExistingDest(t *testing.T) {
	dst := t.TempDir()
	src := saveTar(t, tarOf(t, reg("a/b", "x"), dir("d/"), reg("../x", "y")))
	if _, err := Unpack(context.Background(), src, dst); !errors.Is(err, ErrUnsafe) {
		t.Fatalf("Unpack = %v, want ErrUnsafe", err)
	}
	if got := listTree(t, dst); len(got) > 0 {
		t.Errorf("dst holds %q after a refusal", got)
	}
	os.WriteFile(filepath.Join(dst, "mine"), []byte("x"), 0o644)
	if _, err := Unpack(context.Background(), src, dst); !errors.Is(err, ErrNotEmpty) {
		t.Fatalf("Unpack = %v, want ErrNotEmpty", err)
	}
	if got := listTree(t, dst); !slices.Equal(got, []string{"mine"}) {
		t.Errorf("dst holds %q, want only mine", got)
	}
}

// An unpack that is cancelled, or given a bad option, leaves nothing.
func TestUnpackLeavesNothing(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	src := saveTar(t, tarOf(t, reg("a/b", "x")))
	for _, tc := range []struct {
		name string
		ctx  context.Context
		opts []Option
		want error
	}{
		{name: "cancelled", ctx: cancelled, want: context.Canceled},
		{name: "negative limit", ctx: context.Background(), opts: []Option{WithLimits(Limits{Bytes: -1})}, want: ErrInvalidOption},
		{name: "empty scratch directory", ctx: context.Background(), opts: []Option{WithScratchDir("")}, want: ErrInvalidOption},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base, scratch := t.TempDir(), t.TempDir()
			_, err := Unpack(tc.ctx, src, filepath.Join(base, "rootfs"), append([]Option{WithScratchDir(scratch)}, tc.opts...)...)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Unpack = %v, want %v", err, tc.want)
			}
			if got := append(listTree(t, base), listTree(t, scratch)...); len(got) > 0 {
				t.Errorf("left behind: %q", got)
			}
		})
	}
}
