package nvmlnode_test

import (
	"context"
	"fmt"
	"os"

	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
)

// Discover a sim's GPUs and topology. Without options it loads the host's
// NVML; here a simulated DGX-1 stands in for it.
func ExampleDiscover() {
	sim, err := simnode.New("dgx1-volta", simnode.WithDriverVersion("535.104.05"))
	if err != nil {
		fmt.Println(err)
		return
	}
	devRoot, _ := os.MkdirTemp("", "dev")
	defer os.RemoveAll(devRoot)

	inv, err := nvmlnode.Discover(context.Background(), nvmlnode.WithNVML(sim.NVML()), nvmlnode.WithDevRoot(devRoot))
	if err != nil {
		fmt.Println(err) // errors.Is(err, nvmlnode.ErrDriverNotLoaded) on a sim without a loaded driver
		return
	}
	fmt.Printf("driver %s, CUDA %s, %d GPUs\n", inv.DriverVersion, inv.CUDAVersion, len(inv.Devices))
	fmt.Println(inv.Devices[0].Model, inv.Devices[0].BusID)
	l := inv.Topology.Link(0, 3)
	fmt.Printf("GPU0-GPU3: %d NVLinks, PCIe %s, score %d\n", l.NVLinks, l.PCIe.Abbrev(), l.Score())
	// Output:
	// driver 535.104.05, CUDA 12.2, 8 GPUs
	// Tesla V100-SXM2-16GB 0000:06:00.0
	// GPU0-GPU3: 2 NVLinks, PCIe PHB, score 230
}
