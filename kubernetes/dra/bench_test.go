package dra_test

import (
	"testing"

	"github.com/gpuiso/gpuiso/kubernetes/dra"
)

// BenchmarkDevices16: computing the ResourceSlice's devices of a 16-GPU
// node (dgx2), which happens at start and on every health change.
func BenchmarkDevices16(b *testing.B) {
	_, inv := inventory(b, "dgx2")
	if len(inv.Devices) != 16 {
		b.Fatalf("%d GPUs", len(inv.Devices))
	}
	for b.Loop() {
		if len(dra.Devices(inv, inv.Devices, dra.SliceOptions{})) != 16 {
			b.Fatal("devices")
		}
	}
}
