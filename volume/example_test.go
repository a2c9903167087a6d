package volume_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/volume"
)

// An agent builds the volume at start, so that no container waits for it.
func ExampleManager_Build() {
	m, err := volume.New(volume.WithRoot("/var/run/gpuiso/volumes"))
	if err != nil {
		fmt.Println(err)
		return
	}
	vol, err := m.Build(context.Background())
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(vol.Path, vol.Version, vol.Files)
}

// A container of an image that asks for the driver gets the volume's mount
// and environment once its requirements are met.
func ExampleCheck() {
	img := volume.Image{Env: []string{
		"NVIDIA_VISIBLE_DEVICES=all",
		"NVIDIA_REQUIRE_CUDA=cuda>=12.4 brand=tesla,driver>=535,driver<536",
		"PATH=/usr/bin",
	}}
	drv := volume.Driver{Version: "535.309.01", CUDA: 12020}
	gpus := []node.Device{{Index: 0, ComputeCapability: "8.0", Brand: "Tesla"}}
	if !img.NeedsVolume() {
		return
	}
	if err := volume.Check(img, drv, gpus); err != nil {
		fmt.Println(err)
		return
	}
	vol := &volume.Volume{Version: drv.Version, Path: "/var/run/gpuiso/volumes/nvidia_535.309.01"}
	inj := vol.Injection(img.Env)
	fmt.Println(inj.Mount.Source, "->", inj.Mount.Destination, inj.Mount.Options)
	for _, e := range inj.Env {
		fmt.Println(e)
	}

	gpus[0].Brand = "GeForce"
	err := volume.Check(img, drv, gpus)
	fmt.Println(errors.Is(err, volume.ErrRequirementUnmet), err)
	// Output:
	// /var/run/gpuiso/volumes/nvidia_535.309.01 -> /usr/local/nvidia [rbind ro nosuid nodev]
	// PATH=/usr/bin:/usr/local/nvidia/bin
	// LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64
	// true NVIDIA_REQUIRE_CUDA "cuda>=12.4 brand=tesla,driver>=535,driver<536" unmet by driver 535.309.01 (cuda 12.2) on gpu 0 (arch 8.0, brand GeForce): cuda>=12.4 and brand=tesla false
}
