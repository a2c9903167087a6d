package cluster

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/node"
)

// Defaults of Config.
const (
	// DefaultBin is where .ci/k8s-build.sh puts the pinned binaries.
	DefaultBin = "/var/cache/gpuiso/k8s-v1.37.2/bin"
	// DefaultRunc is the current runc .ci/current-docker.sh builds.
	DefaultRunc = "/var/cache/gpuiso/bin/runc"
	// DefaultParent holds the clusters' directories. It is under /run on
	// purpose: the cluster's sockets (containerd's among them, which is
	// root on the host) must stay out of reach of a native gpuiso
	// container in the host view run beside it, which gets /run as a
	// private tmpfs (containerizer/native).
	DefaultParent = "/run/gpuiso-test"
)

// Binaries lists the programs Config.Bin must hold.
func Binaries() []string {
	return []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl",
		"containerd", "containerd-shim-runc-v2", "ctr"}
}

// NodeName is the cluster's first Node: its kubelet's --hostname-override,
// which also becomes its InternalIP. Node i (from 0) is 127.0.0.<i+1>.
const NodeName = "127.0.0.1"

// ErrNotStarted matches the errors of a Cluster that Start did not return
// (its zero value).
var ErrNotStarted = fmt.Errorf("cluster not started: %w", node.ErrInvalid)

// owns reports whether c names a directory and cgroup of its own: every
// teardown step checks it, since an empty name would stand for the whole
// host (every process, every cgroup).
func (c *Cluster) owns() bool {
	return filepath.IsAbs(c.Dir) && strings.HasPrefix(filepath.Base(c.Dir), "k8s-") &&
		c.cgroupName == "gpuiso-"+filepath.Base(c.Dir)
}

// ErrStart matches every error of Start: a cluster that could not start
// (a missing program, no root, a process that exited or never became
// ready) is unavailable.
var ErrStart = fmt.Errorf("start the cluster: %w", node.ErrUnavailable)

// Config says where the cluster's programs are.
type Config struct {
	// Bin is the directory of Binaries ($GPUISO_K8S_BIN, else DefaultBin,
	// when empty).
	Bin string
	// Runc is the runc binary containerd runs (DefaultRunc when empty).
	Runc string
	// Parent is where the cluster's directory is made (DefaultParent when
	// empty): an absolute path of at most MaxParent bytes, since
	// containerd's shim sockets live below it.
	Parent string
	// Pause is a static program that, run with PauseArgs, waits until it
	// is killed: the sandbox image's one file.
	Pause     string
	PauseArgs []string
	// Nodes are the worker nodes (at most MaxNodes); none means one node
	// without labels.
	Nodes []NodeConfig
	// SchedulerConfig is a KubeSchedulerConfiguration (YAML or JSON) the
	// scheduler runs with, as an operator would give it (its profiles and
	// plugin arguments); the cluster sets its client connection and leader
	// election. Empty: the scheduler's defaults.
	SchedulerConfig []byte
}

// Cluster is a running cluster.
type Cluster struct {
	// Dir holds everything of the cluster.
	Dir string
	// Kubeconfig is an admin kubeconfig file.
	Kubeconfig string
	// Client is an admin client.
	Client kubernetes.Interface
	// Nodes are the worker nodes, the first named NodeName.
	Nodes []*Node
	// KubeletRoot is, on the host, the first node's kubelet root
	// directory: a DRA kubelet plugin's sockets go in its plugins/ and
	// plugins_registry/.
	KubeletRoot string
	// DevicePluginDir is, on the host, the first node's kubelet
	// device-plugin directory (kubelet.sock is there).
	DevicePluginDir string
	// CDIDir is, on the host, a CDI spec directory the first node's
	// containerd reads.
	CDIDir string
	// PauseImage is the sandbox image's reference.
	PauseImage string

	cfg        Config
	cgroupName string
	procs      []*proc
	stopped    bool
}

// PluginsDir is the kubelet's DRA plugin directory.
func (c *Cluster) PluginsDir() string { return filepath.Join(c.KubeletRoot, "plugins") }

// RegistryDir is the kubelet's plugin registration directory.
func (c *Cluster) RegistryDir() string { return filepath.Join(c.KubeletRoot, "plugins_registry") }

// ContainerdAddress is the first node's containerd socket.
func (c *Cluster) ContainerdAddress() string {
	if len(c.Nodes) == 0 {
		return ""
	}
	return c.Nodes[0].containerdSock
}

// CgroupName is the first node's kubelet cgroup root (without the leading
// slash); every node's is below the cluster's own cgroup.
func (c *Cluster) CgroupName() string {
	if len(c.Nodes) == 0 {
		return c.cgroupName
	}
	return c.Nodes[0].cgroup
}

// Node returns the node called name, or nil.
func (c *Cluster) Node(name string) *Node {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// MaxParent is the longest Config.Parent: a shim socket,
// <parent>/k8s-<8 hex>/s<node>/<64 hex>, must fit a socket address (107
// bytes).
const MaxParent = 107 - len("/k8s-01234567/s1/") - 64

// BinEnv names the directory of the pinned binaries when Config.Bin is
// empty (as for the other suites of this module); DefaultBin without it.
const BinEnv = "GPUISO_K8S_BIN"

func (cfg *Config) defaults() {
	if cfg.Bin == "" {
		cfg.Bin = os.Getenv(BinEnv)
	}
	if cfg.Bin == "" {
		cfg.Bin = DefaultBin
	}
	if cfg.Runc == "" {
		cfg.Runc = DefaultRunc
	}
	if cfg.Parent == "" {
		cfg.Parent = DefaultParent
	}
}

// Missing lists what of cfg's programs does not exist: none when a
// cluster can be started from them.
func (cfg Config) Missing() []string {
	cfg.defaults()
	var out []string
	for _, b := range Binaries() {
		if err := executable(filepath.Join(cfg.Bin, b)); err != nil {
			out = append(out, err.Error())
		}
	}
	if err := executable(cfg.Runc); err != nil {
		out = append(out, err.Error())
	}
	for _, p := range []string{"unshare", "nsenter", "mount"} {
		if _, err := lookPath(p); err != nil {
			out = append(out, err.Error())
		}
	}
	return out
}

func executable(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("%s: not an executable file", p)
	}
	return nil
}

// Start starts a cluster and waits until its Node is Ready. On an error
// everything it started is torn down again.
func Start(ctx context.Context, cfg Config) (_ *Cluster, err error) {
	cfg.defaults()
	if m := cfg.Missing(); len(m) > 0 {
		return nil, fmt.Errorf("%w: missing %s", ErrStart, strings.Join(m, "; "))
	}
	if cfg.Pause == "" {
		return nil, fmt.Errorf("%w: no pause program", ErrStart)
	}
	if len(cfg.Nodes) > MaxNodes {
		return nil, fmt.Errorf("%w: %d nodes, at most %d", ErrStart, len(cfg.Nodes), MaxNodes)
	}
	if !filepath.IsAbs(cfg.Parent) || len(cfg.Parent) > MaxParent {
		return nil, fmt.Errorf("%w: parent directory %q: want an absolute path of at most %d bytes", ErrStart, cfg.Parent, MaxParent)
	}
	if !linux.IsRoot() {
		return nil, fmt.Errorf("%w: needs root", ErrStart)
	}
	if err := os.MkdirAll(cfg.Parent, 0o700); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrStart, err)
	}
	if _, err := Reap(cfg.Parent); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrStart, err)
	}
	var id [4]byte
	rand.Read(id[:])
	name := "k8s-" + hex.EncodeToString(id[:])
	dir := filepath.Join(cfg.Parent, name)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrStart, err)
	}
	c := &Cluster{Dir: dir, cfg: cfg, cgroupName: "gpuiso-" + name, PauseImage: "gpuiso.test/pause:" + name}
	nodes := cfg.Nodes
	if len(nodes) == 0 {
		nodes = []NodeConfig{{}}
	}
	for i, nc := range nodes {
		c.Nodes = append(c.Nodes, c.newNode(i, nc))
	}
	c.KubeletRoot, c.DevicePluginDir, c.CDIDir = c.Nodes[0].KubeletRoot, c.Nodes[0].DevicePluginDir, c.Nodes[0].CDIDir
	defer func() {
		if err != nil {
			logs := c.Logs(4000)
			if serr := c.Stop(context.WithoutCancel(ctx)); serr != nil {
				err = errors.Join(err, serr)
			}
			err = fmt.Errorf("%w: %w\n%s", ErrStart, err, logs)
		}
	}()
	if err := c.start(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *Cluster) start(ctx context.Context) error {
	if err := c.writeOwner(); err != nil {
		return err
	}
	for _, d := range []string{"logs", "etcd", "pki", "flexvolume", "kubectl-cache"} {
		if err := os.MkdirAll(filepath.Join(c.Dir, d), 0o755); err != nil {
			return err
		}
	}
	if err := c.makeCgroups(); err != nil {
		return err
	}
	ports, err := freePorts(5)
	if err != nil {
		return err
	}
	etcdPort, peerPort, apiPort, cmPort, schedPort := ports[0], ports[1], ports[2], ports[3], ports[4]

	creds, err := c.writeCredentials(apiPort)
	if err != nil {
		return err
	}
	etcd := fmt.Sprintf("http://127.0.0.1:%d", etcdPort)
	peer := fmt.Sprintf("http://127.0.0.1:%d", peerPort)
	if err := c.startProc("etcd", nil, "--data-dir", filepath.Join(c.Dir, "etcd"), "--listen-client-urls", etcd,
		"--advertise-client-urls", etcd, "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "default="+peer); err != nil {
		return err
	}
	server := fmt.Sprintf("https://127.0.0.1:%d", apiPort)
	if err := c.startProc("kube-apiserver", nil, "--etcd-servers", etcd, "--bind-address", "127.0.0.1",
		"--advertise-address", "127.0.0.1", "--endpoint-reconciler-type", "none", "--secure-port", fmt.Sprint(apiPort),
		"--cert-dir", filepath.Join(c.Dir, "pki"), "--token-auth-file", creds.tokens, "--authorization-mode", "RBAC",
		"--service-account-key-file", creds.saPub, "--service-account-signing-key-file", creds.saKey,
		"--service-account-issuer", server, "--service-cluster-ip-range", "10.250.0.0/24",
		// As kubeadm's: a GPU plugin on real nodes runs privileged.
		"--allow-privileged=true"); err != nil {
		return err
	}
	rc, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	c.Client = client
	if err := c.until(ctx, "the API server", func() bool {
		_, err := client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err == nil
	}); err != nil {
		return err
	}
	if err := c.startProc("kube-controller-manager", nil, "--kubeconfig", c.Kubeconfig,
		"--authentication-kubeconfig", c.Kubeconfig, "--authorization-kubeconfig", c.Kubeconfig,
		"--bind-address", "127.0.0.1", "--secure-port", fmt.Sprint(cmPort), "--leader-elect=false",
		"--service-account-private-key-file", creds.saKey, "--use-service-account-credentials=false",
		// The API server's own CA (it made its serving certificate and CA
		// in --cert-dir): pods' service account volumes carry it as ca.crt.
		"--root-ca-file", filepath.Join(c.Dir, "pki", "apiserver.crt"),
		"--flex-volume-plugin-dir", filepath.Join(c.Dir, "flexvolume"),
		"--cert-dir", filepath.Join(c.Dir, "pki", "controller-manager"),
		"--controllers", "*,-bootstrapsigner,-tokencleaner,-nodeipam"); err != nil {
		return err
	}
	schedArgs := []string{"--kubeconfig", c.Kubeconfig,
		"--authentication-kubeconfig", c.Kubeconfig, "--authorization-kubeconfig", c.Kubeconfig,
		"--bind-address", "127.0.0.1", "--secure-port", fmt.Sprint(schedPort), "--leader-elect=false",
		"--cert-dir", filepath.Join(c.Dir, "pki", "scheduler")}
	if len(c.cfg.SchedulerConfig) > 0 {
		path, err := c.writeSchedulerConfig()
		if err != nil {
			return err
		}
		schedArgs = append(schedArgs, "--config", path)
	}
	if err := c.startProc("kube-scheduler", nil, schedArgs...); err != nil {
		return err
	}
	for _, n := range c.Nodes {
		if err := c.startNode(ctx, n); err != nil {
			return err
		}
	}
	for _, n := range c.Nodes {
		if err := c.until(ctx, "node "+n.Name+" to be Ready", func() bool {
			n, err := client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil {
				return false
			}
			for _, cond := range n.Status.Conditions {
				if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
					return len(n.Spec.Taints) == 0
				}
			}
			return false
		}); err != nil {
			return err
		}
	}
	return c.until(ctx, "the default ServiceAccount", func() bool {
		_, err := client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		return err == nil
	})
}

// credentials are the API server's files.
type credentials struct{ tokens, saKey, saPub string }

func (c *Cluster) writeCredentials(apiPort int) (credentials, error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return credentials{}, err
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return credentials{}, err
	}
	var token [16]byte
	rand.Read(token[:])
	tok := hex.EncodeToString(token[:])
	cr := credentials{
		tokens: filepath.Join(c.Dir, "pki", "tokens.csv"),
		saKey:  filepath.Join(c.Dir, "pki", "sa.key"),
		saPub:  filepath.Join(c.Dir, "pki", "sa.pub"),
	}
	c.Kubeconfig = filepath.Join(c.Dir, "kubeconfig")
	files := []struct {
		path string
		body []byte
	}{
		{cr.saKey, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})},
		{cr.saPub, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub})},
		{cr.tokens, []byte(tok + ",admin,admin,system:masters\n")},
		{c.Kubeconfig, fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:%d", insecure-skip-tls-verify: true}}]
users: [{name: admin, user: {token: %q}}]
contexts: [{name: c, context: {cluster: c, user: admin}}]
current-context: c
`, apiPort, tok)},
	}
	for _, f := range files {
		if err := os.WriteFile(f.path, f.body, 0o600); err != nil {
			return credentials{}, err
		}
	}
	return cr, nil
}

// until polls cond every 100 ms until it holds, a process of the cluster
// exits, or two minutes pass (a guard against a hang, not a measurement).
func (c *Cluster) until(ctx context.Context, what string, cond func() bool) error {
	deadline := time.Now().Add(2 * time.Minute)
	for !cond() {
		for _, p := range c.procs {
			if p.exited() {
				return fmt.Errorf("waiting for %s: %s exited", what, p.name)
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("waiting for %s: %w", what, context.DeadlineExceeded)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}

func freePorts(n int) ([]int, error) { return freePortsOn("127.0.0.1", n) }

// writeSchedulerConfig writes the scheduler's configuration: the
// operator's, with the cluster's client connection and no leader
// election.
func (c *Cluster) writeSchedulerConfig() (string, error) {
	var cfg map[string]any
	if err := yaml.Unmarshal(c.cfg.SchedulerConfig, &cfg); err != nil {
		return "", fmt.Errorf("scheduler configuration: %w", err)
	}
	if cfg == nil {
		return "", fmt.Errorf("scheduler configuration: empty")
	}
	cfg["clientConnection"] = map[string]any{"kubeconfig": c.Kubeconfig}
	cfg["leaderElection"] = map[string]any{"leaderElect": false}
	b, err := json.Marshal(cfg)
	if err != nil {
		return "", err
	}
	path := filepath.Join(c.Dir, "scheduler.json")
	return path, os.WriteFile(path, b, 0o600)
}
