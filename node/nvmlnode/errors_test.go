package nvmlnode

import (
	"errors"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuiso/gpuiso/node"
)

// TestNVMLErrorKinds: every NVML result code other than SUCCESS, named or
// not, makes an *NVMLError of exactly one of node's error kinds, and the
// codes this package has sentinels for keep their kinds.
func TestNVMLErrorKinds(t *testing.T) {
	kinds := []error{node.ErrNotSupported, node.ErrInvalid, node.ErrExists, node.ErrNotFound, node.ErrInsufficient, node.ErrUnavailable, node.ErrCorrupt}
	codes := []nvml.Return{nvml.Return(9999)}
	for r := range returnNames {
		if r != nvml.SUCCESS {
			codes = append(codes, r)
		}
	}
	for _, r := range codes {
		err := error(&NVMLError{Op: "op", Device: -1, Return: r})
		n := 0
		for _, k := range kinds {
			if errors.Is(err, k) {
				n++
			}
		}
		if n != 1 {
			t.Errorf("%s matches %d of node's error kinds, want 1", returnName(r), n)
		}
	}
	for _, tt := range []struct {
		ret            nvml.Return
		sentinel, kind error
	}{
		{nvml.ERROR_LIBRARY_NOT_FOUND, ErrLibraryNotFound, node.ErrNotSupported},
		{nvml.ERROR_DRIVER_NOT_LOADED, ErrDriverNotLoaded, node.ErrUnavailable},
		{nvml.ERROR_GPU_IS_LOST, ErrGPULost, node.ErrUnavailable},
		{nvml.ERROR_NOT_SUPPORTED, node.ErrNotSupported, node.ErrNotSupported},
		{nvml.ERROR_FUNCTION_NOT_FOUND, node.ErrNotSupported, node.ErrNotSupported},
		{nvml.ERROR_NOT_FOUND, node.ErrNotFound, node.ErrNotFound},
		{nvml.ERROR_INVALID_ARGUMENT, node.ErrInvalid, node.ErrInvalid},
		{nvml.ERROR_UNKNOWN, node.ErrUnavailable, node.ErrUnavailable},
	} {
		err := &NVMLError{Op: "op", Device: 0, Return: tt.ret}
		if !errors.Is(err, tt.sentinel) || !errors.Is(err, tt.kind) {
			t.Errorf("%s: want it to match %v and %v", returnName(tt.ret), tt.sentinel, tt.kind)
		}
	}
}
