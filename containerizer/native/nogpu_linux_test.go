package native_test

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
)

// TestNoGPU gives a container no GPU: its /dev holds no GPU node (the
// control devices only), /dev/nvidia0 is absent rather than denied, a node
// it makes itself for a GPU cannot be opened, and, on a host whose NVIDIA
// driver is loaded, the driver's parameters in its /proc say
// ModifyDeviceFiles: 0, so that the driver's libraries run as root there
// make no GPU node of their own.
func TestNoGPU(t *testing.T) {
	_, hostParams := os.ReadFile("/proc/driver/nvidia/params")
	versions(t, func(t *testing.T, n *testNode) {
		zero := n.inv.Devices[0].Node
		out, _ := n.run(t, "no-gpu", allocator.Request{}, fmt.Sprintf(`
			$PROBE ls /dev | grep '^nvidia' | sed 's/^/dev: /'
			$PROBE open /dev/nvidia0
			$PROBE mknod /dev/own0 %d %d open
			grep -h ModifyDeviceFiles /proc/driver/nvidia/params 2>/dev/null | sed 's/^/params: /'; true`, zero.Major, zero.Minor))
		got := lines(out)
		for _, want := range []string{"/dev/nvidia0 ENOENT", "/dev/own0 ok", "/dev/own0 EPERM"} {
			if !got[want] {
				t.Errorf("missing %q in the container's output:\n%s", want, out)
			}
		}
		for l := range got {
			name, ok := strings.CutPrefix(l, "dev: ")
			if ok && strings.Trim(strings.TrimPrefix(name, "nvidia"), "0123456789") == "" {
				t.Errorf("the /dev of a container without GPUs holds %s", name)
			}
		}
		if hostParams == nil && !got["params: ModifyDeviceFiles: 0"] {
			t.Errorf("the driver's parameters in the container's /proc do not say ModifyDeviceFiles: 0:\n%s", out)
		}
	})
}
