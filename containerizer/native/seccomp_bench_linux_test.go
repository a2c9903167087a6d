package native

import "testing"

// BenchmarkSeccompProgram measures building the seccomp program from
// Docker's profile (once per capability set and process: "build"), against
// taking it from a containerizer's cache ("cached"), which is what each
// launch after the first pays.
func BenchmarkSeccompProgram(b *testing.B) {
	caps := []int{0, 1, 3, 4, 5, 6, 7, 8, 10, 13, 18, 27, 29, 31}
	b.Run("build", func(b *testing.B) {
		for range b.N {
			if _, err := seccompProgram(capNames(caps)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("cached", func(b *testing.B) {
		var p programs
		for range b.N {
			if _, err := p.get(caps); err != nil {
				b.Fatal(err)
			}
		}
	})
}
