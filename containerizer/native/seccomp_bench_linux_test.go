package native

import "testing"

// BenchmarkSeccompPolicy measures what each init spends building its
// seccomp filter from Docker's profile.
func BenchmarkSeccompPolicy(b *testing.B) {
	for range b.N {
		p, err := seccompPolicy(DefaultCapabilities())
		if err != nil {
			b.Fatal(err)
		}
		if _, err := p.Assemble(); err != nil {
			b.Fatal(err)
		}
	}
}
