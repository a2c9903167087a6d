package cdi_test

import (
	"testing"
)

// BenchmarkPodmanStart is the start (and exit) of a Podman container with a
// gpuiso CDI device against the same container without it, on a simulated
// node: what CDI resolution and the device node add to a start.
func BenchmarkPodmanStart(b *testing.B) {
	n := newPodmanNode(b)
	for _, bc := range []struct {
		name    string
		devices []string
	}{
		{"plain", nil},
		{"cdi-gpu", []string{n.kind + "=3"}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				if _, err := n.run(b, bc.devices, "exit", "0"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
