package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// TestDeployFlags: the DaemonSet's flags are checked against each other.
func TestDeployFlags(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string // "" when accepted
	}{
		{"in-cluster", []string{"--in-cluster"}, ""},
		{"in-cluster and kubeconfig", []string{"--in-cluster", "--kubeconfig", "k"}, "exclude"},
		{"label without dev root", []string{"--in-cluster", "--simulate-label", "k"}, "--sim-root"},
		{"label without credentials", []string{"--simulate-label", "k", "--sim-root", "/d"}, "credentials"},
		{"label and simulate", []string{"--in-cluster", "--simulate-label", "k", "--simulate", "dgx2", "--sim-root", "/d"}, "exclude"},
		{"label", []string{"--in-cluster", "--simulate-label", "k", "--dev-root", "/d"}, ""},
		{"rolling update", []string{"--in-cluster", "--rolling-update-uid", "0b6f3d3e-2b7c-4f5e-9d1a-6c1e2f3a4b5c"}, ""},
		{"rolling update with dynamic MIG", []string{"--in-cluster", "--rolling-update-uid", "0b6f3d3e-2b7c-4f5e-9d1a-6c1e2f3a4b5c", "--dynamic-mig"}, "exclude"},
		{"rolling update, a path for a uid", []string{"--in-cluster", "--rolling-update-uid", "../x"}, "pod's UID"},
		{"driver root on a simulated node", []string{"--simulate", "dgx2", "--sim-root", "/d", "--driver-root", "/x"}, "no use"},
		{"relative driver root", []string{"--driver-root", "x"}, "absolute"},
		{"daemonset without namespace", []string{"--daemonset", "ds"}, "NAMESPACE/NAME"},
		{"daemonset with too many parts", []string{"--daemonset", "a/b/c"}, "NAMESPACE/NAME"},
		{"daemonset", []string{"--daemonset", "gpuiso-system/plugin"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			_, code, done := parse(tt.args, &out)
			if tt.want == "" {
				if done {
					t.Fatalf("refused: %s", out.String())
				}
				return
			}
			if !done || code != 2 || !strings.Contains(out.String(), tt.want) {
				t.Errorf("parse = %d, %v, %q; want 2 and %q", code, done, out.String(), tt.want)
			}
		})
	}
}

// TestFindNVML: NVML is found through the driver root's ld.so cache's
// library directories, and a root without it is an error.
func TestFindNVML(t *testing.T) {
	root := t.TempDir()
	if _, err := findNVML(context.Background(), root); err == nil {
		t.Fatal("found NVML in an empty root")
	}
	lib := filepath.Join(root, "usr/lib64/libnvidia-ml.so.1")
	os.MkdirAll(filepath.Dir(lib), 0o755)
	os.WriteFile(lib, nil, 0o644)
	if got, err := findNVML(context.Background(), root); err != nil || got != lib {
		t.Fatalf("findNVML = %q, %v; want %s", got, err, lib)
	}

	// Debian's layout: the library directory's name links absolutely
	// through the alternatives to the driver's directory; resolved on the
	// host, the links would leave the driver root.
	root = t.TempDir()
	real := filepath.Join(root, "usr/lib/x86_64-linux-gnu/nvidia/current/libnvidia-ml.so.535.1")
	os.MkdirAll(filepath.Dir(real), 0o755)
	os.WriteFile(real, nil, 0o644)
	os.Symlink("libnvidia-ml.so.535.1", filepath.Join(filepath.Dir(real), "libnvidia-ml.so.1"))
	os.MkdirAll(filepath.Join(root, "etc/alternatives"), 0o755)
	os.Symlink("/usr/lib/x86_64-linux-gnu/nvidia/current/libnvidia-ml.so.1", filepath.Join(root, "etc/alternatives/nvidia--libnvidia-ml.so.1-x86_64-linux-gnu"))
	os.Symlink("/etc/alternatives/nvidia--libnvidia-ml.so.1-x86_64-linux-gnu", filepath.Join(root, "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"))
	if got, err := findNVML(context.Background(), root); err != nil || got != real {
		t.Fatalf("findNVML through absolute links = %q, %v; want %s", got, err, real)
	}
}

// TestInRoot: links resolve inside the root, and ".." stops at it.
func TestInRoot(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "a/b"), 0o755)
	os.WriteFile(filepath.Join(root, "a/b/f"), nil, 0o644)
	os.Symlink("/a/b", filepath.Join(root, "abs"))
	os.Symlink("../../../../a", filepath.Join(root, "a/b/up"))
	os.Symlink("loop", filepath.Join(root, "loop"))
	for in, want := range map[string]string{"/abs/f": "/a/b/f", "abs/up/b/f": "/a/b/f", "/../../a/b/f": "/a/b/f"} {
		if got, err := inRoot(root, in); err != nil || got != filepath.Join(root, want) {
			t.Errorf("inRoot(%q) = %q, %v; want %s", in, got, err, want)
		}
	}
	if _, err := inRoot(root, "loop"); err == nil {
		t.Error("a link to itself resolved")
	}
}

// TestUninstalled: a DaemonSet that is gone, being deleted or no longer
// readable means an uninstall; one in place (a rolling update) does not.
func TestUninstalled(t *testing.T) {
	ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "plugin"}}
	deleting := ds.DeepCopy()
	deleting.DeletionTimestamp = &metav1.Time{}
	deleting.Finalizers = []string{"x"}
	forbidden := fake.NewClientset()
	forbidden.PrependReactor("get", "daemonsets", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "apps", Resource: "daemonsets"}, "plugin", nil)
	})
	tests := []struct {
		name   string
		client *fake.Clientset
		want   bool
	}{
		{"in place", fake.NewClientset(ds), false},
		{"gone", fake.NewClientset(), true},
		{"being deleted", fake.NewClientset(deleting), true},
		{"no longer readable", forbidden, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &flags{deploy: deployFlags{daemonSet: "ns/plugin"}}
			if got, why := f.uninstalled(t.Context(), tt.client); got != tt.want {
				t.Errorf("uninstalled = %v (%s), want %v", got, why, tt.want)
			}
		})
	}
	if got, _ := (&flags{}).uninstalled(t.Context(), fake.NewClientset()); got {
		t.Error("without --daemonset, an exit is an uninstall")
	}
}

// TestResolveSimulate: the simulated kind is the Node's label; a Node
// without it is refused.
func TestResolveSimulate(t *testing.T) {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"sim": "dgx-a100"}}}
	f := &flags{nodeName: "n1", deploy: deployFlags{simulateLabel: "sim"}}
	if err := f.resolveSimulate(t.Context(), fake.NewClientset(n)); err != nil || f.simulate != "dgx-a100" {
		t.Fatalf("resolveSimulate = %v, simulate %q", err, f.simulate)
	}
	f = &flags{nodeName: "n1", deploy: deployFlags{simulateLabel: "other"}}
	if err := f.resolveSimulate(t.Context(), fake.NewClientset(n)); err == nil {
		t.Fatal("a Node without the label was accepted")
	}
}

// TestCleanNode: after an uninstall the node keeps nothing of the
// plugin's (the device plugin's MPS directory included), unless a claim is
// still prepared, whose files stay.
func TestCleanNode(t *testing.T) {
	for _, prepared := range []bool{false, true} {
		dir := t.TempDir()
		f := &flags{cdiDir: filepath.Join(dir, "cdi"), stateDir: filepath.Join(dir, "state"),
			pluginsDir: filepath.Join(dir, "plugins"), driverName: "gpu.gpuiso.io", dra: true}
		for _, d := range []string{f.cdiDir, filepath.Join(f.stateDir, "allocator"), filepath.Join(f.stateDir, "claims"),
			filepath.Join(f.pluginsDir, f.driverName)} {
			os.MkdirAll(d, 0o755)
		}
		os.WriteFile(filepath.Join(f.cdiDir, "nvidia.com-gpu.json"), []byte("{}"), 0o644)
		os.WriteFile(filepath.Join(f.stateDir, "allocator", "state.json"), []byte("{}"), 0o644)
		// What the device plugin's concurrent slices' daemons left.
		os.MkdirAll(filepath.Join(f.stateDir, deviceSlicesMPSDir), 0o700)
		os.WriteFile(filepath.Join(f.stateDir, deviceSlicesMPSDir, ".lock"), nil, 0o600)
		if prepared {
			os.WriteFile(filepath.Join(f.stateDir, "claims", "uid.json"), []byte("{}"), 0o644)
		}
		if err := f.cleanNode(context.Background(), slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
			t.Fatal(err)
		}
		var left []string
		filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				left = append(left, strings.TrimPrefix(p, dir))
			}
			return nil
		})
		want := 0
		if prepared {
			want = 3 // the claim's checkpoint, the allocator's state, the daemons' directory
		}
		if len(left) != want {
			t.Errorf("prepared claim %v: left %v", prepared, left)
		}
		if _, err := os.Stat(filepath.Join(f.pluginsDir, f.driverName)); !os.IsNotExist(err) {
			t.Errorf("the DRA socket directory is left: %v", err)
		}
	}
}
