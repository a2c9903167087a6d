package nvmlnode

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuiso/gpuiso/node"
)

// Discovery errors. Each also matches one of node's shared sentinels.
var (
	// ErrLibraryNotFound: the NVML library (libnvidia-ml.so.1) is not
	// installed, so this node has no NVIDIA driver at all.
	ErrLibraryNotFound = node.Sentinel(node.ErrNotSupported, "NVML library libnvidia-ml.so.1 not found")
	// ErrDriverNotLoaded: the NVML library is installed but the NVIDIA kernel
	// driver is not loaded (no GPU, or the module failed to load).
	ErrDriverNotLoaded = node.Sentinel(node.ErrUnavailable, "NVIDIA kernel driver not loaded")
	// ErrGPULost: the GPU stopped answering (fell off the bus).
	ErrGPULost = node.Sentinel(node.ErrUnavailable, "GPU is lost")
)

// NVMLError is an NVML call that did not succeed.
type NVMLError struct {
	// Op names the call, e.g. "init" or "get uuid".
	Op string
	// Device is the NVML index of the device the call was about, or -1.
	Device int
	// Return is NVML's result code.
	Return nvml.Return
}

func (e *NVMLError) Error() string {
	if e.Device >= 0 {
		return fmt.Sprintf("nvml: gpu %d: %s: %s", e.Device, e.Op, returnName(e.Return))
	}
	return fmt.Sprintf("nvml: %s: %s", e.Op, returnName(e.Return))
}

// Is maps NVML's result codes to this package's sentinels, so that
// errors.Is(err, ErrDriverNotLoaded) holds for ERROR_DRIVER_NOT_LOADED.
func (e *NVMLError) Is(target error) bool {
	switch target {
	case ErrLibraryNotFound:
		return e.Return == nvml.ERROR_LIBRARY_NOT_FOUND
	case ErrDriverNotLoaded:
		return e.Return == nvml.ERROR_DRIVER_NOT_LOADED
	case ErrGPULost:
		return e.Return == nvml.ERROR_GPU_IS_LOST
	case node.ErrNotSupported:
		return e.Return == nvml.ERROR_NOT_SUPPORTED || e.Return == nvml.ERROR_FUNCTION_NOT_FOUND ||
			e.Return == nvml.ERROR_LIBRARY_NOT_FOUND
	case node.ErrUnavailable:
		return e.Return == nvml.ERROR_DRIVER_NOT_LOADED || e.Return == nvml.ERROR_GPU_IS_LOST
	case node.ErrNotFound:
		return e.Return == nvml.ERROR_NOT_FOUND
	case node.ErrInvalid:
		return e.Return == nvml.ERROR_INVALID_ARGUMENT
	}
	return false
}

func nvmlError(op string, device int, ret nvml.Return) error {
	if ret == nvml.SUCCESS {
		return nil
	}
	return &NVMLError{Op: op, Device: device, Return: ret}
}
