package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubeletconfig "k8s.io/kubelet/config/v1beta1"
	"k8s.io/utils/ptr"
)

// NodeConfig is one worker node of the cluster.
type NodeConfig struct {
	// Labels are set on the Node when its kubelet registers it.
	Labels map[string]string
}

// MaxNodes is the most nodes a cluster has: they are named 127.0.0.1 to
// 127.0.0.<MaxNodes>.
const MaxNodes = 9

// Node is one worker node: a kubelet and a containerd of its own, sharing
// a mount namespace in which the node's directories are bound over the
// host paths a node's programs use (HostPaths), so that a DaemonSet's
// hostPath volumes on the node see the node's own.
type Node struct {
	// Name is the Node's name, also its InternalIP and the kubelet's
	// address: 127.0.0.<n>.
	Name string
	// Dir holds everything of the node.
	Dir string
	// KubeletRoot is, on the host, the node's /var/lib/kubelet (the
	// kubelet's root directory): its plugins/, plugins_registry/ and
	// device-plugins/.
	KubeletRoot string
	// DevicePluginDir is, on the host, the node's
	// /var/lib/kubelet/device-plugins.
	DevicePluginDir string
	// CDIDir is, on the host, the node's /var/run/cdi, which its
	// containerd reads.
	CDIDir string
	// StateDir is, on the host, the node's /var/lib/gpuiso-kubelet-plugin
	// (the plugin's default state directory).
	StateDir string

	index          int
	cgroup         string // the kubelet's cgroup root, without the leading slash
	containerdSock string
	labels         map[string]string
	containerd     *proc
}

// PluginsDir is the node's kubelet DRA plugin directory, on the host.
func (n *Node) PluginsDir() string { return filepath.Join(n.KubeletRoot, "plugins") }

// RegistryDir is the node's kubelet plugin registration directory, on the
// host.
func (n *Node) RegistryDir() string { return filepath.Join(n.KubeletRoot, "plugins_registry") }

// CgroupName is the node's kubelet cgroup root (without the leading
// slash): its pods' cgroups are below it.
func (n *Node) CgroupName() string { return n.cgroup }

// ContainerdAddress is the node's containerd socket.
func (n *Node) ContainerdAddress() string { return n.containerdSock }

// NRISocket is the node's containerd's NRI socket (its /var/run/nri/nri.sock),
// where an NRI plugin of the node connects. containerd runs no plugin of
// its own (its plugin directories are the node's, empty).
func (n *Node) NRISocket() string { return filepath.Join(n.Dir, "nri.sock") }

// HostPaths are the host paths bound, in each node's mount namespace, to
// the node's own directories: the kubelet's root directory (its fixed
// device-plugin directory included), the CDI spec directory and gpuiso's
// plugin state directory (the chart's defaults). The host lacking one
// gets an empty mount point, removed by the last cluster to stop.
func HostPaths() []string {
	return []string{"/var/lib/kubelet", "/var/run/cdi", "/var/lib/gpuiso-kubelet-plugin"}
}

// newNode lays out node i (from 0) of the cluster.
func (c *Cluster) newNode(i int, cfg NodeConfig) *Node {
	dir := filepath.Join(c.Dir, fmt.Sprintf("n%d", i+1))
	return &Node{
		Name: fmt.Sprintf("127.0.0.%d", i+1), Dir: dir, index: i,
		KubeletRoot:     filepath.Join(dir, "kubelet"),
		DevicePluginDir: filepath.Join(dir, "kubelet", "device-plugins"),
		CDIDir:          filepath.Join(dir, "cdi"),
		StateDir:        filepath.Join(dir, "state"),
		cgroup:          c.cgroupName + fmt.Sprintf("/n%d", i+1),
		containerdSock:  filepath.Join(dir, "containerd.sock"),
		labels:          maps.Clone(cfg.Labels),
	}
}

// shimDir is node n's containerd shim socket directory: short, since a
// shim socket's path must fit a socket address (see MaxParent).
func (c *Cluster) shimDir(n *Node) string { return filepath.Join(c.Dir, fmt.Sprintf("s%d", n.index+1)) }

func (c *Cluster) startNode(ctx context.Context, n *Node) error {
	for _, d := range []string{"kubelet/plugins", "kubelet/plugins_registry", "kubelet/device-plugins", "cdi", "state",
		"pod-logs", "sysctl", "containerd", "runc", "cni/net.d", "cni/bin", "nri/plugins", "nri/conf.d", "pki"} {
		if err := os.MkdirAll(filepath.Join(n.Dir, d), 0o755); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(c.shimDir(n), 0o700); err != nil {
		return err
	}
	if err := c.startContainerd(ctx, n); err != nil {
		return err
	}
	if err := c.ImportImageOn(ctx, n, c.PauseImage, c.cfg.Pause, c.cfg.PauseArgs); err != nil {
		return err
	}
	return c.startKubelet(n)
}

// nodeNamespaceScript is the shell script that prepares a node's mount
// namespace (made private by unshare, so nothing of it reaches the host)
// and then runs its arguments: copies of the /proc/sys files the kubelet
// rewrites, the node's directories over HostPaths, and a tmpfs over
// /var/log, where the kubelet links container logs at a fixed path.
func (c *Cluster) nodeNamespaceScript(n *Node) (string, error) {
	script := []string{"set -e"}
	for _, s := range sysctls {
		src := filepath.Join("/proc/sys", s)
		b, err := os.ReadFile(src)
		if err != nil {
			continue // a key this kernel does not have
		}
		cp := filepath.Join(n.Dir, "sysctl", strings.ReplaceAll(s, "/", "."))
		if err := os.WriteFile(cp, b, 0o644); err != nil {
			return "", err
		}
		script = append(script, fmt.Sprintf("mount --bind %q %q", cp, src))
	}
	own := []string{n.KubeletRoot, n.CDIDir, n.StateDir}
	for i, p := range HostPaths() {
		// Shared inside the node's namespace (a peer group of the node's
		// alone, its parent mounts being private): a pod's volume of it
		// with bidirectional propagation needs that, as on a host whose
		// init makes every mount shared.
		script = append(script, fmt.Sprintf("mount --bind %q %q", own[i], p), fmt.Sprintf("mount --make-shared %q", p))
	}
	script = append(script,
		"mount -t tmpfs -o mode=0755,size=16m gpuiso-node-logs /var/log",
		"mkdir /var/log/containers /var/log/pods",
		`exec "$@"`)
	return strings.Join(script, "\n"), nil
}

// startContainerd starts the node's containerd in a new mount namespace
// (see nodeNamespaceScript); the kubelet joins it.
func (c *Cluster) startContainerd(ctx context.Context, n *Node) error {
	d := func(p string) string { return filepath.Join(n.Dir, p) }
	config := fmt.Sprintf(`version = 3
root = %q
state = %q
imports = []

[plugins]
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = %q

  [plugins.'io.containerd.cri.v1.runtime']
    restrict_oom_score_adj = true
    cdi_spec_dirs = [%q]
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = %q
          Root = %q
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = [%q]
      conf_dir = %q

  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = '127.0.0.1'
    stream_server_port = '0'

  [plugins.'io.containerd.internal.v1.opt']
    path = %q

  [plugins.'io.containerd.nri.v1.nri']
    disable = false
    socket_path = %q
    plugin_path = %q
    plugin_config_path = %q

  [plugins.'io.containerd.shim.v1.manager']
    socket_dir = %q

  [plugins.'io.containerd.server.v1.grpc']
    address = %q

  [plugins.'io.containerd.server.v1.ttrpc']
    address = %q
`, d("containerd/root"), d("containerd/state"), c.PauseImage, n.CDIDir, c.cfg.Runc, d("runc"),
		d("cni/bin"), d("cni/net.d"), d("containerd/opt"), n.NRISocket(), d("nri/plugins"), d("nri/conf.d"), c.shimDir(n), n.containerdSock, n.containerdSock+".ttrpc")
	// A network configuration naming a plugin that is never run: pods use
	// the host's network, and the runtime reports its network ready.
	cni := `{"cniVersion": "1.0.0", "name": "none", "plugins": [{"type": "gpuiso-none"}]}`
	if err := os.WriteFile(d("cni/net.d/10-none.conflist"), []byte(cni), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(d("containerd/config.toml"), []byte(config), 0o644); err != nil {
		return err
	}
	for _, p := range HostPaths() {
		if err := makeHostDir(c.cfg.Parent, p); err != nil {
			return err
		}
	}
	script, err := c.nodeNamespaceScript(n)
	if err != nil {
		return err
	}
	unshare, err := lookPath("unshare")
	if err != nil {
		return err
	}
	// containerd finds its shim in PATH.
	env := []string{"PATH=" + c.cfg.Bin + ":" + os.Getenv("PATH")}
	p, err := c.startCmd("containerd-"+n.short(), unshare, env, "--mount", "--propagation", "private", "--",
		"/bin/sh", "-c", script, "containerd", filepath.Join(c.cfg.Bin, "containerd"), "--config", d("containerd/config.toml"))
	if err != nil {
		return err
	}
	n.containerd = p
	return c.until(ctx, "containerd of node "+n.Name, func() bool {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err := c.CtrOn(cctx, n, nil, "version")
		return err == nil
	})
}

// short names node n in process and log names.
func (n *Node) short() string { return fmt.Sprintf("n%d", n.index+1) }

// sysctls are the /proc/sys files the kubelet rewrites: in its mount
// namespace they are copies.
var sysctls = []string{"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes"}

// freePortsOn returns n free TCP ports of addr.
func freePortsOn(addr string, n int) ([]int, error) {
	var out []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		out = append(out, l.Addr().(*net.TCPAddr).Port)
	}
	return out, nil
}

// startKubelet starts the node's kubelet in its containerd's mount
// namespace, its root directory the node's /var/lib/kubelet.
func (c *Cluster) startKubelet(n *Node) error {
	ports, err := freePortsOn(n.Name, 2)
	if err != nil {
		return err
	}
	d := func(p string) string { return filepath.Join(n.Dir, p) }
	cfg := kubeletconfig.KubeletConfiguration{
		TypeMeta:                 metav1.TypeMeta{APIVersion: "kubelet.config.k8s.io/v1beta1", Kind: "KubeletConfiguration"},
		Address:                  n.Name,
		Port:                     int32(ports[0]),
		ReadOnlyPort:             0,
		HealthzBindAddress:       n.Name,
		HealthzPort:              ptr.To(int32(ports[1])),
		CgroupDriver:             "cgroupfs",
		CgroupRoot:               "/" + n.cgroup,
		FailCgroupV1:             ptr.To(false),
		FailSwapOn:               ptr.To(false),
		PodLogsDir:               d("pod-logs"),
		ContainerRuntimeEndpoint: "unix://" + n.containerdSock,
		StaticPodPath:            "",
		ResolverConfig:           ptr.To("/etc/resolv.conf"),
		Authentication: kubeletconfig.KubeletAuthentication{
			Anonymous: kubeletconfig.KubeletAnonymousAuthentication{Enabled: ptr.To(true)},
			Webhook:   kubeletconfig.KubeletWebhookAuthentication{Enabled: ptr.To(false)},
		},
		Authorization:               kubeletconfig.KubeletAuthorization{Mode: kubeletconfig.KubeletAuthorizationModeAlwaysAllow},
		EvictionHard:                map[string]string{"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
		ImageGCHighThresholdPercent: ptr.To(int32(100)),
		ImageGCLowThresholdPercent:  ptr.To(int32(99)),
		NodeStatusUpdateFrequency:   metav1.Duration{Duration: 2 * time.Second},
		SyncFrequency:               metav1.Duration{Duration: 5 * time.Second},
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	if err := os.WriteFile(d("kubelet.json"), b, 0o644); err != nil {
		return err
	}
	nsenter, err := lookPath("nsenter")
	if err != nil {
		return err
	}
	args := []string{"--target", fmt.Sprint(n.containerd.cmd.Process.Pid), "--mount", "--",
		filepath.Join(c.cfg.Bin, "kubelet"), "--config", d("kubelet.json"), "--kubeconfig", c.Kubeconfig,
		"--root-dir", HostPaths()[0], "--cert-dir", d("pki"), "--hostname-override", n.Name, "--v", "2"}
	if len(n.labels) > 0 {
		var kv []string
		for _, k := range slices.Sorted(maps.Keys(n.labels)) {
			kv = append(kv, k+"="+n.labels[k])
		}
		args = append(args, "--node-labels", strings.Join(kv, ","))
	}
	_, err = c.startCmd("kubelet-"+n.short(), nsenter, nil, args...)
	return err
}
