package deviceplugin_test

import (
	"fmt"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/kubernetes/deviceplugin"
	"github.com/gpuiso/gpuiso/node"
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

// holdersOnly is the allocator as a Source that holds nothing: what
// Allocate was before it held the devices it hands out.
type holdersOnly struct{ a *allocator.Allocator }

func (h holdersOnly) Devices() []node.Device                 { return h.a.Devices() }
func (h holdersOnly) Owners(device string) ([]string, error) { return h.a.Owners(device) }

// BenchmarkAllocate is Allocate's answer for one container of 1 or 8 GPUs
// of a DGX-2, over an allocator with a state directory (each hold written
// and synced, as the kubelet plugin runs it): "holds" holds each GPU for
// its pod, "checks" only refuses GPUs a claim holds, as Allocate did
// before. The holds are given back between iterations, off the clock.
func BenchmarkAllocate(b *testing.B) {
	_, _, inv := testenv.SimulatedNode(b, "dgx2")
	a, err := allocator.New(inv, allocator.WithStateDir(b.TempDir()))
	if err != nil {
		b.Fatal(err)
	}
	defer a.Close()
	for _, src := range []struct {
		name string
		src  deviceplugin.Source
	}{{"holds", a}, {"checks", holdersOnly{a}}} {
		m, err := deviceplugin.New(inv, src.src, deviceplugin.Config{Dir: b.TempDir()})
		if err != nil {
			b.Fatal(err)
		}
		p := m.Plugins()[0]
		var ids []string
		for _, d := range p.Devices() {
			ids = append(ids, d.ID)
		}
		for _, size := range []int{1, 8} {
			b.Run(fmt.Sprintf("src=%s/size=%d", src.name, size), func(b *testing.B) {
				for b.Loop() {
					if _, err := p.Container(ids[:size]); err != nil {
						b.Fatal(err)
					}
					b.StopTimer()
					for _, id := range ids[:size] {
						a.Release(b.Context(), deviceplugin.DeviceOwner(id))
					}
					b.StartTimer()
				}
			})
		}
	}
}
