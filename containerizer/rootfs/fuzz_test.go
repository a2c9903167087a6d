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
func FuzzLayer(f *testing.F) {
	f.Add(tarOf(f, reg("a/b", "x"), symlink("l", "/"), reg("l/x", "y")))
	f.Add(tarOf(f, hardlink("h", "/etc/passwd"), reg("../x", "y")))
	f.Add(gz(f, tarOf(f, dir("d/"), reg("d/.wh..wh..opq", ""), reg("d/.wh...", ""))))
	f.Add(paxSparse(f, "s", 1<<20, 4096, "x"))
	f.Fuzz(func(t *testing.T, layer []byte) {
		base := t.TempDir()
		outside := filepath.Join(base, "outside")
		root := filepath.Join(base, "root")
		for _, d := range []string{outside, root, filepath.Join(base, "src")} {
			os.Mkdir(d, 0o755)
		}
		os.WriteFile(filepath.Join(outside, "keep"), []byte("host"), 0o644)
		os.Symlink(outside, filepath.Join(root, "out"))
		os.WriteFile(filepath.Join(base, "src", "layer"), layer, 0o644)
		src, err := os.OpenRoot(filepath.Join(base, "src"))
		if err != nil {
			t.Fatal(err)
		}
		defer src.Close()
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
