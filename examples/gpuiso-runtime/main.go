// Command gpuiso-runtime has moved to github.com/gpuiso/gpuiso/cmd/gpuiso-runtime.
//
// Deprecated: this program only says where the runtime went, and fails;
// build github.com/gpuiso/gpuiso/cmd/gpuiso-runtime instead. It will be
// removed in the next release.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "gpuiso-runtime has moved: go install github.com/gpuiso/gpuiso/cmd/gpuiso-runtime (this path is deprecated)")
	os.Exit(2)
}
