package cdi_test

import (
	"testing"

	"github.com/gpuiso/gpuiso/isolator/cdi"
)

// BenchmarkNew is spec generation for 8 (dgx1-volta) and 16 (dgx2) GPUs,
// with the driver volume.
func BenchmarkNew(b *testing.B) {
	for _, name := range []string{"dgx1-volta", "dgx2"} {
		inv := simInv(b, name)
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				if _, err := cdi.New(inv, cdi.WithVolume(vol)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkWrite is the write an agent does on every health event: of an
// unchanged spec (a read and a compare) and of a changed one (validated,
// synced, renamed).
func BenchmarkWrite(b *testing.B) {
	for _, name := range []string{"dgx1-volta", "dgx2"} {
		inv := simInv(b, name)
		spec, err := cdi.New(inv, cdi.WithVolume(vol))
		if err != nil {
			b.Fatal(err)
		}
		w := cdi.Writer{Dir: b.TempDir()}
		b.Run(name+"/unchanged", func(b *testing.B) {
			for b.Loop() {
				if _, err := w.Write(b.Context(), spec); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(name+"/changed", func(b *testing.B) {
			other, _ := cdi.New(inv) // without the volume
			i := 1                   // the file holds spec: begin with the other
			for b.Loop() {
				s := spec
				if i%2 == 1 {
					s = other
				}
				i++
				if res, err := w.Write(b.Context(), s); err != nil || !res.Changed {
					b.Fatal(err, res)
				}
			}
		})
	}
}
