package e2e

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// UpdateEnv, set to 1, makes TestChart write the plain manifests from the
// chart instead of comparing them.
const UpdateEnv = "GPUISO_UPDATE_MANIFESTS"

// chartVariants are value sets the chart must render to objects the API
// server accepts.
var chartVariants = map[string][]string{
	"defaults":                     nil,
	"device plugin":                {"--set", "devicePlugin.enabled=true", "--set", "dra.enabled=false"},
	"both with metrics":            {"--set", "devicePlugin.enabled=true", "--set", "metrics.enabled=true", "--set", "hostNetwork=true"},
	"simulated":                    {"--set", "simulate.kind=dgx1-volta", "--set", "apiServer.host=127.0.0.1", "--set-string", "apiServer.port=6443"},
	"shares":                       {"--set", "sharing.gpus=all", "--set", "sharing.config.kind=ShareConfig", "--set", "sharing.config.computePercent=50"},
	"dynamic MIG":                  {"--set", "dra.dynamicMIG=true"},
	"metrics on the pod's address": {"--set", "metrics.enabled=true", "--set", "metrics.address=podIP"},
	"confined":                     {"--set", "confinePlugin=true"},
	"operator's driver":            {"--set", "driverRoot=/run/nvidia/driver", "--set-string", "nodeSelector.gpuiso\\.io/gpu=true"},
}

// TestChart renders the chart: with its defaults exactly the plain
// manifests of kubernetes/deploy/manifests (so they cannot drift apart),
// and with each variant of values objects the API server accepts in a
// server-side dry run (schema, defaulting and admission, nothing stored).
func TestChart(t *testing.T) {
	c := requireCluster(t)
	h := requireHelm(t, c)
	noCluster := &helm{bin: h.bin, home: h.home}
	rendered, err := noCluster.run(t.Context(), "template", release, chartDir, "--namespace", "default")
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
		t.Errorf("%s differs from the chart rendered with its defaults (%s=1 go test -run TestChart ./e2e writes it)", manifestsFile, UpdateEnv)
	}
	if _, err := noCluster.run(t.Context(), "lint", chartDir, "--strict"); err != nil {
		t.Error(err)
	}

	// The objects go into a namespace of the test's own, so that nothing
	// clashes with an installation.
	const ns = "gpuiso-dry-run"
	if _, err := c.Client.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Client.CoreV1().Namespaces().Delete(t.Context(), ns, metav1.DeleteOptions{}) })
	for name, values := range chartVariants {
		t.Run(name, func(t *testing.T) {
			out, err := noCluster.run(t.Context(), append([]string{"template", "dry-run", chartDir, "--namespace", "default",
				"--set", "namespace.name=" + ns}, values...)...)
			if err != nil {
				t.Fatal(err)
			}
			f := filepath.Join(t.TempDir(), "manifests.yaml")
			if err := os.WriteFile(f, []byte(out), 0o644); err != nil {
				t.Fatal(err)
			}
			// The pod mounts parts of the driver root, never the
			// host's /.
			if strings.Contains(out, "path: /\n") {
				t.Errorf("the host's / is mounted:\n%s", out)
			}
			res, err := c.Kubectl(t.Context(), "apply", "--dry-run=server", "-f", f)
			if err != nil {
				t.Fatalf("%v\n%s\nthe rendered manifests:\n%s", err, res, out)
			}
			if n := strings.Count(res, "(server dry run)"); n != strings.Count(out, "\nkind: ") {
				t.Errorf("%d objects accepted, %d rendered:\n%s", n, strings.Count(out, "\nkind: "), res)
			}
		})
	}
	// Bad values are refused at render time.
	if _, err := noCluster.run(t.Context(), "template", release, chartDir, "--set", "dra.enabled=false"); err == nil {
		t.Error("a chart serving nothing rendered")
	}
	for _, p := range []string{"/", "..", "usr/../..", ""} {
		if _, err := noCluster.run(t.Context(), "template", release, chartDir, "--set", "driverPaths[0]="+p); err == nil {
			t.Errorf("driver path %q rendered", p)
		}
	}
	// Asked, the plugin is confined; by default /metrics stays inside the
	// pod.
	confined, err := noCluster.run(t.Context(), "template", release, chartDir, "--set", "confinePlugin=true")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"kind: ValidatingAdmissionPolicy\n", "kind: ValidatingAdmissionPolicyBinding\n"} {
		if !strings.Contains(confined, want) {
			t.Errorf("the confined rendering has no %s", strings.TrimSpace(want))
		}
	}
	metrics, err := noCluster.run(t.Context(), "template", release, chartDir, "--set", "metrics.enabled=true")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(metrics, "--metrics-address=127.0.0.1:") || strings.Contains(metrics, "containerPort") {
		t.Errorf("metrics on by default listen beyond the pod's loopback:\n%s", metrics)
	}
}

// manifestsHeader opens the plain manifests.
const manifestsHeader = `# gpuiso's kubelet plugin without Helm: the chart kubernetes/deploy/gpuiso
# rendered with its defaults (helm template gpuiso kubernetes/deploy/gpuiso
# --namespace default). Set the image to your registry's, then
#   kubectl apply -f kubernetes/deploy/manifests/gpuiso.yaml
# The end-to-end suite checks that this file is what the chart renders.
`
