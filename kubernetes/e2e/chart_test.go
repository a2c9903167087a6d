package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

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
	"not confined":                 {"--set", "confinePlugin=false"},
	"operator's driver":            {"--set", "driverRoot=/run/nvidia/driver", "--set-string", "nodeSelector.gpuiso\\.io/gpu=true"},
}

// TestChart renders the chart with each variant of values to objects the
// API server accepts in a server-side dry run (schema, defaulting and
// admission, nothing stored), none mounting the host's /. Package deploy's
// TestChart checks what needs helm alone: the plain manifests, the lint,
// the values refused.
func TestChart(t *testing.T) {
	c := requireCluster(t)
	h := requireHelm(t, c)
	noCluster := &helm{bin: h.bin, home: h.home}
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
}
