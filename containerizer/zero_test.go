package containerizer_test

import (
	"context"
	"errors"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/containerizer/docker"
	"github.com/gpuiso/gpuiso/containerizer/native"
	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/node"
)

// TestZeroValues: the containerizers' zero values refuse every call with an
// error instead of panicking.
func TestZeroValues(t *testing.T) {
	testenv.ZeroValueSafe(t, []any{&containerizer.Preparer{}, &containerizer.Prepared{}, &containerizer.Lifecycle{},
		&native.Containerizer{}, &docker.Containerizer{}})
}

// TestZeroValueLaunch: a valid spec handed to a zero containerizer is
// refused with ErrNotMade.
func TestZeroValueLaunch(t *testing.T) {
	for name, c := range map[string]containerizer.Containerizer{
		"native": &native.Containerizer{}, "docker": &docker.Containerizer{},
		"lifecycle": &containerizer.Lifecycle{},
	} {
		for _, spec := range []containerizer.Spec{
			{ID: "job-1", Command: []string{"true"}, GPUs: allocator.Request{Count: 1}},
			{ID: "job-1", Image: "probe", GPUs: allocator.Request{Count: 1}},
		} {
			if _, err := c.Launch(context.Background(), spec); !errors.Is(err, containerizer.ErrNotMade) && !errors.Is(err, node.ErrInvalid) {
				t.Errorf("%s: launch %+v = %v", name, spec, err)
			}
		}
		if _, err := c.Recover(context.Background()); !errors.Is(err, containerizer.ErrNotMade) {
			t.Errorf("%s: recover = %v", name, err)
		}
	}
	var pr containerizer.Preparer
	if _, err := pr.Prepare(context.Background(), containerizer.Spec{ID: "job-1"}, containerizer.Image{}); !errors.Is(err, node.ErrInvalid) {
		t.Errorf("zero preparer: %v", err)
	}
}
