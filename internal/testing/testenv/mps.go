package testenv

import (
	"os"
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/isolator/mps"
)

// MPS is the suite of tests against the real MPS control daemon
// (nvidia-cuda-mps-control, Debian's nvidia-cuda-mps, which
// .ci/provision.sh installs): it runs without a GPU, its server only when a
// CUDA client connects. "all" in RequireEnv requires it.
const MPS Suite = "mps"

// RequireMPS skips tb unless the process is root and the node has the MPS
// control daemon's binary (in PATH or the driver's directories). It returns
// the binary's path.
func RequireMPS(tb testing.TB) string {
	tb.Helper()
	if !linux.IsRoot() {
		skipMPS(tb, "needs root: a daemon in a mount namespace of its own")
	}
	bin, err := mps.Lookup("")
	if err != nil {
		skipMPS(tb, "%v (bash .ci/provision.sh installs nvidia-cuda-mps)", err)
	}
	return bin
}

// skipMPS is skip for the MPS suite, which "all" requires too.
func skipMPS(tb testing.TB, format string, args ...any) {
	tb.Helper()
	if !Required(MPS) && requiresAll() {
		tb.Fatalf("required suite %q cannot run: "+format, append([]any{MPS}, args...)...)
	}
	skip(tb, MPS, format, args...)
}

// requiresAll reports whether RequireEnv names "all".
func requiresAll() bool {
	for _, s := range strings.Split(os.Getenv(RequireEnv), ",") {
		if strings.TrimSpace(s) == "all" {
			return true
		}
	}
	return false
}

// RequireSimulatedMPS is RequireMPS for tests that run MPS daemons for the
// GPUs of a simulated node. Where a real NVIDIA kernel driver is loaded, the
// daemon refuses a GPU the driver does not have (it ends at its start), so
// such a test skips there, whatever the required suites: the hardware
// suite's share test (internal/testing/hwtest) covers shares on that node's real
// GPUs.
func RequireSimulatedMPS(tb testing.TB) string {
	tb.Helper()
	bin := RequireMPS(tb)
	if _, err := os.Stat("/proc/driver/nvidia/version"); err == nil {
		tb.Skip("a real NVIDIA driver is loaded: its MPS daemon refuses a simulated GPU (internal/testing/hwtest's share test covers this node's GPUs)")
	}
	return bin
}
