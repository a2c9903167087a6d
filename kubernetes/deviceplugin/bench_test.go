package deviceplugin_test

import (
	"fmt"
	"testing"

	"github.com/gpuiso/gpuiso/kubernetes/deviceplugin"
)

// BenchmarkPreferred: GetPreferredAllocation's placement on a 16-GPU node
// (dgx2), all GPUs available, for several sizes.
func BenchmarkPreferred(b *testing.B) {
	s := start(b, "dgx2", deviceplugin.Config{})
	p := s.mgr.Plugins()[0]
	var ids []string
	for _, d := range p.Devices() {
		ids = append(ids, d.ID)
	}
	for _, size := range []int{1, 2, 4, 8} {
		b.Run(fmt.Sprintf("size-%d", size), func(b *testing.B) {
			for b.Loop() {
				if _, err := p.Preferred(b.Context(), ids, nil, size); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
