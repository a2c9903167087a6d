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
	if strings.Contains(confined, "--gpu-reset") {
		t.Error("GPU resets are on by default")
	}
	if out, err := run(t.Context(), "template", release, chartDir, "--set", "gpuReset=true"); err != nil || !strings.Contains(out, "- --gpu-reset\n") {
		t.Errorf("gpuReset=true renders no --gpu-reset (%v)", err)
	}
	testChartRolling(t, run, confined)
	testChartNRI(t, run, confined)
}

// testChartRolling: by default the DaemonSet rolls with a surge, each
// instance told its pod's UID and Ready once registered; without surge, and
// with dynamic MIG or the device plugin (which cannot serve beside another
// instance), the old pod goes first and nothing of it is asked.
func testChartRolling(t *testing.T, run func(context.Context, ...string) (string, error), defaults string) {
	t.Helper()
	for _, want := range []string{"maxSurge: 1", "maxUnavailable: 0", "--rolling-update-uid=$(POD_UID)", "fieldPath: metadata.uid",
		"--ready-file=/ready/registered", "command: [/usr/bin/gpuiso-kubelet-plugin, --is-ready, /ready/registered]"} {
		if !strings.Contains(defaults, want) {
			t.Errorf("the default rendering lacks %q", want)
		}
	}
	for _, set := range [][]string{{"rollingUpdate.surge=false"}, {"dra.dynamicMIG=true"}, {"devicePlugin.enabled=true"}} {
		args := []string{"template", release, chartDir}
		for _, v := range set {
			args = append(args, "--set", v)
		}
		out, err := run(t.Context(), args...)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(out, "maxSurge") || strings.Contains(out, "rolling-update-uid") || strings.Contains(out, "readinessProbe") ||
			!strings.Contains(out, "maxUnavailable: 1") {
			t.Errorf("with %v the DaemonSet still surges:\n%s", set, out)
		}
	}
}

// testChartNRI: NRI placement is off by default; policy numa serves the
// runtime's socket, mounted from its directory; another policy is refused.
func testChartNRI(t *testing.T, run func(context.Context, ...string) (string, error), defaults string) {
	t.Helper()
	if strings.Contains(defaults, "--nri-policy") || strings.Contains(defaults, "name: nri") {
		t.Error("NRI is on by default")
	}
	out, err := run(t.Context(), "template", release, chartDir, "--set", "nri.policy=numa", "--set", "nri.socket=/run/nri-x/nri.sock")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"--nri-policy=numa", "--nri-socket=/run/nri-x/nri.sock", "mountPath: /run/nri-x", "path: /run/nri-x"} {
		if !strings.Contains(out, want) {
			t.Errorf("with nri.policy=numa the rendering lacks %q", want)
		}
	}
	if _, err := run(t.Context(), "template", release, chartDir, "--set", "nri.policy=spread"); err == nil {
		t.Error("nri.policy=spread rendered")
	}
}

// sharedFile is the plugin's DaemonSet the chart renders with memory
// shares on a simulated node: hostPID, privileged, the state directory
// mounted with bidirectional propagation, the host's cgroups and the
// driver's paths mounted.
var sharedFile = filepath.Join("testdata", "daemonset-shared-simulated.yaml")

// TestChartSharing renders the DaemonSet with memory shares (sharing.gpus)
// on simulated nodes: exactly testdata's (written with UpdateEnv=1), and
// with what the MPS daemons need to outlive the pod (the host's pid
// namespace, a privileged container, the host's cgroups, mounts that
// reach the node, the MPS binary under the driver root), none of which
// the chart asks for without shares; plainDirs drops the bidirectional
// mount.
func TestChartSharing(t *testing.T) {
	run := helm(t, testenv.RequireHelm(t))
	args := []string{"template", release, chartDir, "--namespace", "default", "--show-only", "templates/daemonset.yaml",
		"--set", "simulate.kind=dgx1-volta"}
	shared, err := run(t.Context(), append(args, "--set-string", "sharing.gpus=0")...)
	if err != nil {
		t.Fatal(err)
	}
	if os.Getenv(UpdateEnv) == "1" {
		if err := os.WriteFile(sharedFile, []byte(shared), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(sharedFile)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(want, []byte(shared)) {
		t.Errorf("%s differs from the chart rendered with sharing.gpus=0 (%s=1 go test -run TestChartSharing ./deploy writes it)", sharedFile, UpdateEnv)
	}
	plain, err := run(t.Context(), append(args, "--set-string", "sharing.gpus=0", "--set", "sharing.plainDirs=true")...)
	if err != nil {
		t.Fatal(err)
	}
	unshared, err := run(t.Context(), args...)
	if err != nil {
		t.Fatal(err)
	}
	needs := []string{"hostPID: true", "privileged: true", "mountPropagation: Bidirectional", "path: /sys/fs/cgroup",
		"--mps-cgroup-parent=auto", "--mps-driver-root=/driver-root", "--mps-mount-namespace=runtime", "--mps-shm-size=64Mi", "mountPath: /driver-root/usr"}
	for _, n := range needs {
		if !strings.Contains(shared, n) {
			t.Errorf("with shares the DaemonSet lacks %q", n)
		}
		if strings.Contains(unshared, n) {
			t.Errorf("without shares the DaemonSet has %q", n)
		}
	}
	if strings.Contains(plain, "mountPropagation") || !strings.Contains(plain, "--mps-plain-dirs") {
		t.Errorf("with sharing.plainDirs the DaemonSet still propagates mounts, or lacks --mps-plain-dirs:\n%s", plain)
	}
}

// TestChartDevicePluginSharing: devicePlugin.sharing=mps gives the device
// plugin --device-plugin-sharing=mps and the MPS daemons' placement (the
// host's pid namespace, the cgroup parent, the mount namespace, the
// driver root), DRA on or off; time slicing (the default) gives neither
// without DRA; an unknown strategy fails the install.
func TestChartDevicePluginSharing(t *testing.T) {
	run := helm(t, testenv.RequireHelm(t))
	args := []string{"template", release, chartDir, "--namespace", "default", "--show-only", "templates/daemonset.yaml",
		"--set", "simulate.kind=dgx1-volta", "--set", "devicePlugin.enabled=true", "--set-string", "sharing.gpus=0"}
	needs := []string{"hostPID: true", "privileged: true", "mountPropagation: Bidirectional",
		"--mps-cgroup-parent=auto", "--mps-driver-root=/driver-root", "--mps-mount-namespace=runtime", "mountPath: /driver-root/usr"}
	for _, dra := range []string{"true", "false"} {
		sliced, err := run(t.Context(), append(args, "--set", "dra.enabled="+dra, "--set", "devicePlugin.sharing=mps")...)
		if err != nil {
			t.Fatal(err)
		}
		timed, err := run(t.Context(), append(args, "--set", "dra.enabled="+dra)...)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(sliced, "--device-plugin-sharing=mps") || strings.Contains(timed, "--device-plugin-sharing") {
			t.Errorf("dra.enabled=%s: --device-plugin-sharing=mps in the MPS strategy's DaemonSet %v, in time slicing's %v",
				dra, strings.Contains(sliced, "--device-plugin-sharing=mps"), strings.Contains(timed, "--device-plugin-sharing"))
		}
		for _, n := range needs {
			if !strings.Contains(sliced, n) {
				t.Errorf("dra.enabled=%s: with the MPS strategy the DaemonSet lacks %q", dra, n)
			}
			if dra == "false" && strings.Contains(timed, n) {
				t.Errorf("with time slices and no DRA the DaemonSet has %q", n)
			}
		}
	}
	if out, err := run(t.Context(), append(args, "--set", "devicePlugin.sharing=spatial")...); err == nil || !strings.Contains(err.Error()+out, "devicePlugin.sharing") {
		t.Errorf("devicePlugin.sharing=spatial: %v\n%s", err, out)
	}
}
