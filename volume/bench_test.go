package volume

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
)

// BenchmarkBuild builds the host driver's volume: cold by hard links, cold
// by copying (Mesos' way), and warm (the volume is there and intact).
func BenchmarkBuild(b *testing.B) {
	testenv.RequireRoot(b)
	testenv.RequireNVIDIALibraries(b)
	ctx := context.Background()
	cold := func(links bool) func(b *testing.B) {
		return func(b *testing.B) {
			base := b.TempDir()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				m, err := New(WithRoot(filepath.Join(base, fmt.Sprint(i))), WithLinks(links))
				if err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				v, err := m.Build(ctx)
				if err != nil || !v.Built {
					b.Fatalf("Build = %+v, %v", v, err)
				}
				b.StopTimer()
				if err := os.RemoveAll(m.Root()); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		}
	}
	b.Run("cold-links", cold(true))
	b.Run("cold-copy", cold(false))
	b.Run("warm", func(b *testing.B) {
		m, err := New(WithRoot(filepath.Join(b.TempDir(), "volumes")))
		if err != nil {
			b.Fatal(err)
		}
		if _, err := m.Build(ctx); err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if v, err := m.Build(ctx); err != nil || v.Built {
				b.Fatalf("Build = %+v, %v", v, err)
			}
		}
	})
}
