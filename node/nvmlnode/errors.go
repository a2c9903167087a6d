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
// errors.Is(err, ErrDriverNotLoaded) holds for ERROR_DRIVER_NOT_LOADED, and
// every code to exactly one of node's error kinds (see returnKind).
func (e *NVMLError) Is(target error) bool {
	switch target {
	case ErrLibraryNotFound:
		return e.Return == nvml.ERROR_LIBRARY_NOT_FOUND
	case ErrDriverNotLoaded:
		return e.Return == nvml.ERROR_DRIVER_NOT_LOADED
	case ErrGPULost:
		return e.Return == nvml.ERROR_GPU_IS_LOST
	}
	return target == returnKind(e.Return)
}

// returnKind is the kind of node's vocabulary an NVML result code (other
// than SUCCESS) is: what the driver or GPU does not offer is
// node.ErrNotSupported; a malformed call node.ErrInvalid; a thing NVML does
// not find node.ErrNotFound; too little memory or too few resources
// node.ErrInsufficient; a corrupt inforom node.ErrCorrupt; a second init
// node.ErrExists; every other code (driver not loaded, GPU lost, no
// permission, timeouts, a reset required, unknown codes) node.ErrUnavailable.
func returnKind(r nvml.Return) error {
	switch r {
	case nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_FUNCTION_NOT_FOUND, nvml.ERROR_LIBRARY_NOT_FOUND,
		nvml.ERROR_VGPU_ECC_NOT_SUPPORTED, nvml.ERROR_FREQ_NOT_SUPPORTED, nvml.ERROR_DEPRECATED:
		return node.ErrNotSupported
	case nvml.ERROR_INVALID_ARGUMENT, nvml.ERROR_ARGUMENT_VERSION_MISMATCH, nvml.ERROR_INSUFFICIENT_SIZE:
		return node.ErrInvalid
	case nvml.ERROR_NOT_FOUND:
		return node.ErrNotFound
	case nvml.ERROR_MEMORY, nvml.ERROR_INSUFFICIENT_RESOURCES:
		return node.ErrInsufficient
	case nvml.ERROR_CORRUPTED_INFOROM:
		return node.ErrCorrupt
	case nvml.ERROR_ALREADY_INITIALIZED:
		return node.ErrExists
	}
	return node.ErrUnavailable
}

func nvmlError(op string, device int, ret nvml.Return) error {
	if ret == nvml.SUCCESS {
		return nil
	}
	return &NVMLError{Op: op, Device: device, Return: ret}
}
