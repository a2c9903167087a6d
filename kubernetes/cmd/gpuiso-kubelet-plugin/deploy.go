package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gpuiso/gpuiso/isolator/cdi"
	"github.com/gpuiso/gpuiso/node/simnode"
	"github.com/gpuiso/gpuiso/volume"
)

// deployFlags are the flags of the program run as a DaemonSet (the
// chart's): credentials of its service account, the simulated node kind
// read from the Node, NVML from a driver root, the DaemonSet whose removal
// means "uninstall", and a metrics endpoint.
type deployFlags struct {
	inCluster     bool
	simulateLabel string
	driverRoot    string
	daemonSet     string // namespace/name
	metricsAddr   string
	rollingUID    string // the pod's UID, for a rolling update
	readyFile     string
	isReady       string
}

func (d *deployFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&d.inCluster, "in-cluster", false, "use the pod's service account (a DaemonSet's credentials) instead of --kubeconfig")
	fs.StringVar(&d.simulateLabel, "simulate-label", "", "with --sim-root: simulate the node kind the Node's label `KEY` names (a test cluster whose nodes are of several kinds)")
	fs.StringVar(&d.driverRoot, "driver-root", "", "load NVML from the driver installed under `DIR` (the host's root as mounted in the pod; default: the program's own library path)")
	fs.StringVar(&d.daemonSet, "daemonset", "", "`NAMESPACE/NAME` of the DaemonSet running the program: when it is gone at exit (uninstall), the program removes what it left on the node")
	fs.StringVar(&d.metricsAddr, "metrics-address", "", "serve Prometheus metrics on `ADDR` (host:port) at /metrics, and /healthz")
	fs.StringVar(&d.readyFile, "ready-file", "", "write `FILE` once the kubelet registered the DRA driver (for a readiness probe: --is-ready FILE)")
	fs.StringVar(&d.isReady, "is-ready", "", "check, as a readiness probe, whether the serving instance wrote `FILE` (--ready-file): exit status 0 when it did, 1 when not yet; nothing else runs")
	fs.StringVar(&d.rollingUID, "rolling-update-uid", "", "DRA: serve beside another instance of the plugin on the node (a DaemonSet rolling with a surge): `UID` is the pod's UID, which names this instance's sockets; every claim operation of either instance then runs one at a time across both, on the state they share (the kubelet, 1.33 or later, may call either); not with --dynamic-mig")
}

// check validates the deploy flags against the others; it returns the
// reason a command line is refused, or "".
func (d *deployFlags) check(f *flags) string {
	switch {
	case d.inCluster && f.kubeconfig != "":
		return "--in-cluster and --kubeconfig exclude each other"
	case d.simulateLabel != "" && f.simulate != "":
		return "--simulate-label and --simulate exclude each other"
	case d.simulateLabel != "" && f.devRoot == "":
		return "--simulate-label needs --sim-root DIR for the simulated host tree"
	case d.simulateLabel != "" && !d.inCluster && f.kubeconfig == "":
		return "--simulate-label needs credentials (--in-cluster or --kubeconfig) to read the Node"
	case d.driverRoot != "" && (d.simulateLabel != "" || f.simulate != ""):
		return "--driver-root has no use on a simulated node"
	case d.driverRoot != "" && !filepath.IsAbs(d.driverRoot):
		return "--driver-root must be an absolute path"
	case d.rollingUID != "" && f.mig.dynamic:
		// The MIG devices made for claims are known to the instance
		// that made them.
		return "--rolling-update-uid and --dynamic-mig exclude each other"
	case d.rollingUID != "" && (len(d.rollingUID) > 64 || strings.ContainsAny(d.rollingUID, "/\x00 ")):
		return "--rolling-update-uid wants the pod's UID"
	}
	if d.daemonSet != "" {
		ns, name, ok := strings.Cut(d.daemonSet, "/")
		if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
			return "--daemonset wants NAMESPACE/NAME"
		}
	}
	return ""
}

// client returns a client of the API server: the service account's
// (--in-cluster) or --kubeconfig's; nil without either.
func (f *flags) client() (kubernetes.Interface, error) {
	var cfg *rest.Config
	var err error
	switch {
	case f.deploy.inCluster:
		cfg, err = rest.InClusterConfig()
	case f.kubeconfig != "":
		cfg, err = clientcmd.BuildConfigFromFlags("", f.kubeconfig)
	default:
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("credentials: %w", err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("credentials: %w", err)
	}
	return client, nil
}

// resolveSimulate sets f.simulate from the Node's label --simulate-label.
func (f *flags) resolveSimulate(ctx context.Context, client kubernetes.Interface) error {
	if f.deploy.simulateLabel == "" {
		return nil
	}
	n, err := client.CoreV1().Nodes().Get(ctx, f.nodeName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("read node %s's simulated kind: %w", f.nodeName, err)
	}
	kind := n.Labels[f.deploy.simulateLabel]
	if kind == "" {
		return fmt.Errorf("node %s has no label %s naming its simulated kind (one of %s)", f.nodeName, f.deploy.simulateLabel,
			strings.Join(simnode.Names(), ", "))
	}
	f.simulate = kind
	return nil
}

// nvmlLibrary returns the NVML library to load: the default (dlopen of
// libnvidia-ml.so.1 by the program's own library path), or the one the
// driver root's ld.so cache names, as a path under the driver root.
func (f *flags) nvmlLibrary(ctx context.Context) (nvml.Interface, error) {
	if f.deploy.driverRoot == "" {
		return nvml.New(), nil
	}
	p, err := findNVML(ctx, f.deploy.driverRoot)
	if err != nil {
		return nil, err
	}
	return nvml.New(nvml.WithLibraryPath(p)), nil
}

// libDirs are where a driver installs NVML when its root has no ld.so
// cache that names it.
var libDirs = []string{"usr/lib/x86_64-linux-gnu", "usr/lib64", "usr/lib/aarch64-linux-gnu", "lib/x86_64-linux-gnu", "lib64", "usr/lib"}

// findNVML finds libnvidia-ml.so.1 of the driver installed under root:
// through root's ld.so cache (volume.Manager.Library), else in the usual
// library directories. Its links are followed inside root (a
// distribution's alternatives link absolutely:
// /usr/lib/.../libnvidia-ml.so.1 -> /etc/alternatives/...).
func findNVML(ctx context.Context, root string) (string, error) {
	const lib = "libnvidia-ml.so.1"
	if m, err := volume.New(volume.WithDriverRoot(root)); err == nil {
		if p, err := m.Library(ctx, lib); err == nil {
			return p, nil
		}
	}
	for _, d := range libDirs {
		p, err := inRoot(root, filepath.Join("/", d, lib))
		if err != nil {
			continue
		}
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p, nil
		}
	}
	return "", fmt.Errorf("driver root %s: no %s in its ld.so cache or library directories: %w", root, lib, fs.ErrNotExist)
}

// inRoot resolves p as a process whose root is root would: every link on
// the way, absolute or relative, is followed inside root, and ".." stops
// at root. It returns the path on this host.
func inRoot(root, p string) (string, error) {
	parts := strings.Split(filepath.Clean("/"+p), "/")
	cur := "/"
	for hops := 0; len(parts) > 0; {
		part := parts[0]
		parts = parts[1:]
		switch part {
		case "", ".":
			continue
		case "..":
			cur = filepath.Dir(cur)
			continue
		}
		next := filepath.Join(cur, part)
		fi, err := os.Lstat(filepath.Join(root, next))
		if err != nil {
			return "", err
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			cur = next
			continue
		}
		if hops++; hops > 40 {
			return "", fmt.Errorf("%s in %s: too many links", p, root)
		}
		target, err := os.Readlink(filepath.Join(root, next))
		if err != nil {
			return "", err
		}
		if filepath.IsAbs(target) {
			cur = "/"
		}
		parts = append(strings.Split(target, "/"), parts...)
	}
	return filepath.Join(root, cur), nil
}

// uninstalled reports whether the program's DaemonSet is gone or being
// deleted, which is how an uninstall looks from a pod of it; losing the
// right to read it (its RBAC or service account deleted first) counts as
// gone too. A rolling update or a deleted pod leaves the DaemonSet in
// place: then the node keeps its state for the next pod.
func (f *flags) uninstalled(ctx context.Context, client kubernetes.Interface) (bool, string) {
	if f.deploy.daemonSet == "" || client == nil {
		return false, ""
	}
	ns, name, _ := strings.Cut(f.deploy.daemonSet, "/")
	ds, err := client.AppsV1().DaemonSets(ns).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return true, "the DaemonSet is gone"
	case apierrors.IsForbidden(err), apierrors.IsUnauthorized(err):
		return true, "the DaemonSet can no longer be read (its RBAC or service account is gone)"
	case err != nil:
		return false, ""
	case ds.DeletionTimestamp != nil:
		return true, "the DaemonSet is being deleted"
	}
	return false, ""
}

// cleanNode removes what the program left on the node once its
// installation is gone: the node's CDI spec, the DRA driver's socket
// directory (with the framework's lock file and its empty device metadata
// directory), the allocator's state and, for a simulated node, its host
// tree. A claim still prepared (a pod still running with it) keeps its
// checkpoint and CDI spec, and the state they need; that is reported.
func (f *flags) cleanNode(ctx context.Context, log *slog.Logger) error {
	var errs []error
	if err := (cdi.Writer{Dir: f.cdiDir}).Remove(ctx, cdi.DefaultKind); err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, err)
	}
	if f.dra {
		// The framework's device metadata directory, emptied as claims
		// are unprepared, goes first.
		dir := filepath.Join(f.pluginsDir, f.driverName)
		lock := filepath.Join(dir, "serialize.lock") // the framework's, in a rolling update
		if err := os.Remove(lock); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
		errs = append(errs, removeEmpty(filepath.Join(dir, "dra-device-metadata")), removeEmpty(dir))
	}
	claims := filepath.Join(f.stateDir, "claims")
	left, _ := os.ReadDir(claims)
	if len(left) > 0 {
		log.Warn("uninstalled with claims still prepared: their checkpoints, CDI specs and the allocator's state stay", "claims", len(left))
		return errors.Join(errs...)
	}
	errs = append(errs, f.cleanShares(ctx), removeEmpty(claims), os.RemoveAll(filepath.Join(f.stateDir, "allocator")))
	if f.simulate != "" && f.devRoot != "" {
		root, _ := filepath.Abs(f.devRoot)
		if err := (&simnode.Host{Root: root}).Remove(); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
		errs = append(errs, removeEmpty(root))
	}
	return errors.Join(errs...)
}

// removeEmpty removes dir when it exists and is empty.
func removeEmpty(dir string) error {
	err := os.Remove(dir)
	if err == nil || errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if entries, rerr := os.ReadDir(dir); rerr == nil && len(entries) > 0 {
		return fmt.Errorf("%s is not empty: %d entries left", dir, len(entries))
	}
	return err
}

// afterExit runs once serve has returned because the program was told to
// stop: when its installation is gone, it cleans the node.
func afterExit(f *flags, log *slog.Logger) {
	if f.deploy.daemonSet == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client, err := f.client()
	if err != nil || client == nil {
		return
	}
	gone, why := f.uninstalled(ctx, client)
	if !gone {
		log.Info("the installation stays: the node's state is kept for the next start")
		return
	}
	log.Info("uninstalled: removing what the plugin left on the node", "why", why)
	if err := f.cleanNode(ctx, log); err != nil {
		log.Warn("clean the node", "err", err)
	}
}
