// Package deploy_test checks the Helm chart with helm alone: what it
// renders with its defaults (the plain manifests), its lint, and the
// values it refuses. The end-to-end suite checks that the API server
// accepts what it renders.
package deploy_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
)

// UpdateEnv, set to 1, makes TestChart write the plain manifests from the
// chart instead of comparing them.
const UpdateEnv = "GPUISO_UPDATE_MANIFESTS"

var (
	chartDir      = "gpuiso"
	manifestsFile = filepath.Join("manifests", "gpuiso.yaml")
)

// release is the release name the plain manifests are rendered with.
const release = "gpuiso"

// manifestsHeader opens the plain manifests.
const manifestsHeader = `# gpuiso's kubelet plugin without Helm: the chart kubernetes/deploy/gpuiso
# rendered with its defaults (helm template gpuiso kubernetes/deploy/gpuiso
# --namespace default). Set the image to your registry's, then
#   kubectl apply -f kubernetes/deploy/manifests/gpuiso.yaml
# go test ./deploy (in kubernetes/) checks that this file is what the chart renders.
`

// helm runs helm, its own state in a directory of the test's.
func helm(t *testing.T, bin string) func(ctx context.Context, args ...string) (string, error) {
	home := t.TempDir()
	return func(ctx context.Context, args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home+"/cache", "HELM_CONFIG_HOME="+home+"/config",
			"HELM_DATA_HOME="+home+"/data")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			return out.String(), fmt.Errorf("helm %s: %w: %s", strings.Join(args, " "), err, out.String())
		}
		return out.String(), nil
	}
}

// TestChart renders the chart: with its defaults exactly the plain
// manifests of manifests/gpuiso.yaml (so they cannot drift apart), helm
// lint --strict clean, the admission policy on when asked and metrics on
// the pod's loopback by default; values serving nothing and driver paths
// outside the driver root are refused.
func TestChart(t *testing.T) {
	run := helm(t, testenv.RequireHelm(t))
	rendered, err := run(t.Context(), "template", release, chartDir, "--namespace", "default")
	if err != nil {
		t.Fatal(err)
	}
	if os.Getenv(UpdateEnv) == "1" {
		if err := os.WriteFile(manifestsFile, []byte(manifestsHeader+rendered), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(manifestsFile)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(want, []byte(manifestsHeader+rendered)) {
		t.Errorf("%s differs from the chart rendered with its defaults (%s=1 go test -run TestChart ./deploy writes it)", manifestsFile, UpdateEnv)
	}
	if _, err := run(t.Context(), "lint", chartDir, "--strict"); err != nil {
		t.Error(err)
	}
	// Bad values are refused at render time.
	if _, err := run(t.Context(), "template", release, chartDir, "--set", "dra.enabled=false"); err == nil {
		t.Error("a chart serving nothing rendered")
	}
	for _, p := range []string{"/", "..", "usr/../..", ""} {
		if _, err := run(t.Context(), "template", release, chartDir, "--set", "driverPaths[0]="+p); err == nil {
			t.Errorf("driver path %q rendered", p)
		}
	}
	// By default the plugin is confined, and only asked not to is it not;
	// by default /metrics stays inside the pod.
	confined, err := run(t.Context(), "template", release, chartDir)
	if err != nil {
		t.Fatal(err)
	}
	unconfined, err := run(t.Context(), "template", release, chartDir, "--set", "confinePlugin=false")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"kind: ValidatingAdmissionPolicy\n", "kind: ValidatingAdmissionPolicyBinding\n"} {
		if !strings.Contains(confined, want) {
			t.Errorf("the default rendering has no %s", strings.TrimSpace(want))
		}
		if strings.Contains(unconfined, want) {
			t.Errorf("the rendering with confinePlugin=false has a %s", strings.TrimSpace(want))
		}
	}
	metrics, err := run(t.Context(), "template", release, chartDir, "--set", "metrics.enabled=true")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(metrics, "--metrics-address=127.0.0.1:") || strings.Contains(metrics, "containerPort") {
		t.Errorf("metrics on by default listen beyond the pod's loopback:\n%s", metrics)
	}
}
