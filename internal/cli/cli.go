// Package cli holds what gpuiso's example programs share: the one line a
// person reads when a node has no usable driver.
package cli

import (
	"errors"

	"github.com/gpuiso/gpuiso/allocator"
)

// ExplainDiscover turns a discovery error into one line naming the cause
// and, when it is the driver, the way to run without one.
func ExplainDiscover(err error) string {
	const hint = "; run with --simulate dgx1-volta (or another shipped topology) to use a simulated node"
	switch {
	case errors.Is(err, allocator.ErrLibraryNotFound):
		return "NVML library libnvidia-ml.so.1 not found: the NVIDIA driver is not installed on this host" + hint
	case errors.Is(err, allocator.ErrDriverNotLoaded):
		return "NVIDIA kernel driver not loaded: the NVML library is installed but no driver answers (no GPU, or the module is not loaded)" + hint
	}
	return err.Error()
}
