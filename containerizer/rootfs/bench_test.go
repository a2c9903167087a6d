package rootfs

import (
	"archive/tar"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

// BenchmarkUnpack unpacks a docker save tar of 64 MiB of file content
// (sixteen 4 MiB files of random bytes), plain and gzip-compressed.
func BenchmarkUnpack(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	var es []ent
	for i := range 16 {
		body := make([]byte, 4<<20)
		for j := range body {
			body[j] = byte(r.Uint32())
		}
		es = append(es, ent{h: tar.Header{Name: fmt.Sprintf("d/f%d", i), Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body))}, body: body})
	}
	layer := tarOf(b, es...)
	for name, l := range map[string][]byte{"plain": layer, "gzip": gz(b, layer)} {
		b.Run(name, func(b *testing.B) {
			src := saveTar(b, l)
			b.SetBytes(64 << 20)
			for b.Loop() {
				dst := filepath.Join(b.TempDir(), "rootfs")
				if _, err := Unpack(context.Background(), src, dst); err != nil {
					b.Fatal(err)
				}
				os.RemoveAll(dst)
			}
		})
	}
}

// BenchmarkUnpackSparse unpacks a 2 GiB PAX sparse entry.
func BenchmarkUnpackSparse(b *testing.B) {
	src := saveTar(b, paxSparse(b, "big", 2<<30, 1<<30, "hello"))
	for b.Loop() {
		dst := filepath.Join(b.TempDir(), "rootfs")
		if _, err := Unpack(context.Background(), src, dst); err != nil {
			b.Fatal(err)
		}
		os.RemoveAll(dst)
	}
}
