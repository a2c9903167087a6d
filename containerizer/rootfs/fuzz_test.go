package rootfs

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// FuzzLayer applies arbitrary bytes as a layer over a root that holds a
// symlink to a directory outside it: whatever the layer holds, nothing
// outside changes and nothing panics.
//
// The seeds are small, so that the engine's work on each input (mutating
// it, minimising a new one) stays short and it runs thousands of inputs a
// minute: most are gzip-compressed (a few hundred bytes for several
// entries), and the uncompressed ones end without tar's two zero blocks.
// Together they reach what the extractor does: a link out of the root and
// a write through it, a hard link to a host file, a path climbing out,
// whiteouts (opaque and of "."), a PAX sparse entry, and both the plain
// and the gzip stream.
func FuzzLayer(f *testing.F) {
	f.Add(gz(f, tarOf(f, reg("a/b", "x"), symlink("l", "/"), reg("l/x", "y"))))
	f.Add(gz(f, tarOf(f, hardlink("h", "/etc/passwd"), reg("../x", "y"))))
	f.Add(gz(f, tarOf(f, dir("d/"), reg("d/.wh..wh..opq", ""), reg("d/.wh...", ""))))
	f.Add(gz(f, paxSparse(f, "s", 64<<10, 4096, "x")))
	f.Add(unterminated(tarOf(f, symlink("out/x", "/"))))
	f.Add(unterminated(tarOf(f, reg("out/x", "y"))))
	// One tree per fuzzing process, in memory where the host has a tmpfs
	// at /dev/shm: each input then costs a few file operations that touch
	// no disk. Each input gets a fresh, empty root.
	base, err := os.MkdirTemp("/dev/shm", "gpuiso-fuzzlayer-")
	if err != nil {
		base = f.TempDir()
	} else {
		f.Cleanup(func() { os.RemoveAll(base) })
	}
	outside := filepath.Join(base, "outside")
	root := filepath.Join(base, "root")
	for _, d := range []string{outside, filepath.Join(base, "src")} {
		if err := os.Mkdir(d, 0o755); err != nil {
			f.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(outside, "keep"), []byte("host"), 0o644); err != nil {
		f.Fatal(err)
	}
	src, err := os.OpenRoot(filepath.Join(base, "src"))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { src.Close() })
	f.Fuzz(func(t *testing.T, layer []byte) {
		if err := os.RemoveAll(root); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(root, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(outside, filepath.Join(root, "out")); err != nil {
			t.Fatal(err)
		}
		if err := src.WriteFile("layer", layer, 0o644); err != nil {
			t.Fatal(err)
		}
		x, err := newExtractor(root, Limits{Bytes: 4 << 20, Entries: 1000}.withDefaults(), true)
		if err != nil {
			t.Fatal(err)
		}
		defer x.close()
		x.applyLayer(context.Background(), src, "layer")
		if got := listTree(t, outside); !slices.Equal(got, []string{"keep"}) {
			t.Errorf("outside the root: %q", got)
		}
		if b, _ := os.ReadFile(filepath.Join(outside, "keep")); string(b) != "host" {
			t.Errorf("keep holds %q", b)
		}
	})
}

// unterminated drops the two zero blocks that end a tar: the archive still
// reads to its end, in fewer bytes.
func unterminated(b []byte) []byte { return b[:len(b)-1024] }
