package testenv

import (
	"os"
	"testing"
)

// HelmEnv names the helm binary that the chart's tests run; without it
// they run DefaultHelm, the pinned helm that .ci/helm-build.sh builds.
const (
	HelmEnv     = "GPUISO_HELM"
	DefaultHelm = "/var/cache/gpuiso/helm-v4.3.1/bin/helm"
)

// RequireHelm skips tb unless the helm binary (HelmEnv, else DefaultHelm)
// is there, and returns its path.
func RequireHelm(tb testing.TB) string {
	tb.Helper()
	bin := os.Getenv(HelmEnv)
	if bin == "" {
		bin = DefaultHelm
	}
	if _, err := os.Stat(bin); err != nil {
		skip(tb, Helm, "no helm at %s (bash .ci/helm-build.sh builds it; %s names another): %v", bin, HelmEnv, err)
	}
	return bin
}
