package containerizer_test

import (
	"context"
	"errors"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer/docker"
	"github.com/gpuiso/gpuiso/containerizer/rootfs"
	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/isolator/cdi"
	"github.com/gpuiso/gpuiso/isolator/cgroups"
	"github.com/gpuiso/gpuiso/isolator/mps"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
	"github.com/gpuiso/gpuiso/volume"
)

// someClient is a Docker client that is not nil; nothing calls it.
type someClient struct{ docker.Client }

// TestNilOptions: every constructor of the library that takes functional
// options refuses a nil one with an error of kind node.ErrInvalid, rather
// than panicking.
func TestNilOptions(t *testing.T) {
	ctx := context.Background()
	sim, err := simnode.New("dgx1-volta")
	if err != nil {
		t.Fatal(err)
	}
	inv, err := nvmlnode.Discover(ctx, nvmlnode.WithNVML(sim.NVML()))
	if err != nil {
		t.Fatal(err)
	}
	a, err := allocator.New(inv)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	for name, call := range map[string]func() error{
		"simnode.New":            func() error { _, err := simnode.New("dgx1-volta", nil); return err },
		"nvmlnode.Discover":      func() error { _, err := nvmlnode.Discover(ctx, nil); return err },
		"nvmlnode.NewMIGManager": func() error { _, err := nvmlnode.NewMIGManager(nil); return err },
		"allocator.New":          func() error { _, err := allocator.New(inv, nil); return err },
		"allocator.Claim": func() error {
			_, err := a.Claim(ctx, "c", []node.DeviceRef{{Index: 0, UUID: inv.Devices[0].UUID}}, nil)
			return err
		},
		"rootfs.Unpack":     func() error { _, err := rootfs.Unpack(ctx, t.TempDir(), t.TempDir(), nil); return err },
		"docker.NewRuntime": func() error { _, err := docker.NewRuntime(someClient{}, nil); return err },
		"volume.New":        func() error { _, err := volume.New(nil); return err },
		"cdi.New":           func() error { _, err := cdi.New(inv, nil); return err },
		"cgroups.New":       func() error { _, err := cgroups.New(nil); return err },
		"mps.New":           func() error { _, err := mps.New(t.TempDir(), nil); return err },
		"isolator.NewPlan":  func() error { _, err := isolator.NewPlan("c", inv, nil, nil, nil, nil); return err },
	} {
		err := func() (err error) {
			defer func() {
				if r := recover(); r != nil {
					err = errors.New("panicked")
				}
			}()
			return call()
		}()
		if !errors.Is(err, node.ErrInvalid) {
			t.Errorf("%s with a nil option = %v, want an error of kind node.ErrInvalid", name, err)
		}
	}
	if al := a.Allocations(); len(al) != 0 {
		t.Errorf("a refused claim holds GPUs: %+v", al)
	}
}
