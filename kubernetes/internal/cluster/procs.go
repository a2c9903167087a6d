package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubeletconfig "k8s.io/kubelet/config/v1beta1"
	"k8s.io/utils/ptr"

	"github.com/gpuiso/gpuiso/internal/linux"
)

// proc is a process of the cluster.
type proc struct {
	name string
	cmd  *exec.Cmd
	id   linux.Process
	log  string
	done chan struct{}
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func lookPath(name string) (string, error) { return exec.LookPath(name) }

// startProc starts the cluster's binary name with args.
func (c *Cluster) startProc(name string, env []string, args ...string) error {
	return c.startCmd(name, filepath.Join(c.cfg.Bin, name), env, args...)
}

// startCmd starts path as the cluster's process name, its output in
// logs/<name>.log. It dies with the test process (SIGKILL).
func (c *Cluster) startCmd(name, path string, env []string, args ...string) error {
	logPath := filepath.Join(c.Dir, "logs", name+".log")
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer log.Close()
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Env = append(os.Environ(), env...)
	cmd.Dir = c.Dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	if st, err := linux.ReadProcStat("", cmd.Process.Pid); err == nil {
		p.id = linux.Process{Pid: cmd.Process.Pid, Start: st.Start}
	}
	go func() {
		cmd.Wait()
		close(p.done)
	}()
	c.procs = append(c.procs, p)
	return nil
}

// stop sends p SIGTERM, then SIGKILL after grace.
func (p *proc) stop(grace time.Duration) {
	if p.exited() {
		return
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return
	case <-time.After(grace):
	}
	p.cmd.Process.Kill()
	<-p.done
}

// Logs returns the end of every process's log, at most n bytes each.
func (c *Cluster) Logs(n int) string {
	var b strings.Builder
	for _, p := range c.procs {
		out, _ := os.ReadFile(p.log)
		if len(out) > n {
			out = out[len(out)-n:]
		}
		fmt.Fprintf(&b, "=== %s (exited: %v)\n%s\n", p.name, p.exited(), out)
	}
	return b.String()
}

// Ctr runs ctr against the cluster's containerd in namespace k8s.io.
func (c *Cluster) Ctr(ctx context.Context, stdin []byte, args ...string) (string, error) {
	if !c.owns() || c.cfg.Bin == "" {
		return "", ErrNotStarted
	}
	cmd := exec.CommandContext(ctx, filepath.Join(c.cfg.Bin, "ctr"), append([]string{"-a", c.containerdSock, "-n", "k8s.io"}, args...)...)
	if stdin != nil {
		cmd.Stdin = strings.NewReader(string(stdin))
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// Kubectl runs the cached kubectl against the cluster.
func (c *Cluster) Kubectl(ctx context.Context, args ...string) (string, error) {
	if !c.owns() || c.cfg.Bin == "" {
		return "", ErrNotStarted
	}
	cmd := exec.CommandContext(ctx, filepath.Join(c.cfg.Bin, "kubectl"),
		append([]string{"--kubeconfig", c.Kubeconfig, "--cache-dir", filepath.Join(c.Dir, "kubectl-cache")}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

func (c *Cluster) startContainerd(ctx context.Context) error {
	d := func(p string) string { return filepath.Join(c.Dir, p) }
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
    disable = true

  [plugins.'io.containerd.shim.v1.manager']
    socket_dir = %q

  [plugins.'io.containerd.server.v1.grpc']
    address = %q

  [plugins.'io.containerd.server.v1.ttrpc']
    address = %q
`, d("containerd/root"), d("containerd/state"), c.PauseImage, c.CDIDir, c.cfg.Runc, d("runc"),
		d("cni/bin"), d("cni/net.d"), d("containerd/opt"), d("s"), c.containerdSock, c.containerdSock+".ttrpc")
	// A network configuration naming a plugin that is never run: pods use
	// the host's network, and the runtime reports its network ready.
	cni := `{"cniVersion": "1.0.0", "name": "none", "plugins": [{"type": "gpuiso-none"}]}`
	if err := os.WriteFile(d("cni/net.d/10-none.conflist"), []byte(cni), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(d("containerd/config.toml"), []byte(config), 0o644); err != nil {
		return err
	}
	// containerd finds its shim in PATH.
	env := []string{"PATH=" + c.cfg.Bin + ":" + os.Getenv("PATH")}
	if err := c.startProc("containerd", env, "--config", d("containerd/config.toml")); err != nil {
		return err
	}
	return c.until(ctx, "containerd", func() bool {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err := c.Ctr(cctx, nil, "version")
		return err == nil
	})
}

func (c *Cluster) importPause(ctx context.Context) error {
	return c.ImportImage(ctx, c.PauseImage, c.cfg.Pause, c.cfg.PauseArgs)
}

// sysctls are the /proc/sys files the kubelet rewrites: in its mount
// namespace they are copies.
var sysctls = []string{"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes"}

// hostDevicePlugins is the kubelet's device-plugin directory, a constant
// of the kubelet: in its mount namespace the cluster's own is bound over
// it. (Its other fixed path, /var/log/containers, lies in a tmpfs there.)
const hostDevicePlugins = "/var/lib/kubelet/device-plugins"

func (c *Cluster) startKubelet(port, healthzPort int) error {
	d := func(p string) string { return filepath.Join(c.Dir, p) }
	cfg := kubeletconfig.KubeletConfiguration{
		TypeMeta:                 metav1.TypeMeta{APIVersion: "kubelet.config.k8s.io/v1beta1", Kind: "KubeletConfiguration"},
		Address:                  "127.0.0.1",
		Port:                     int32(port),
		ReadOnlyPort:             0,
		HealthzBindAddress:       "127.0.0.1",
		HealthzPort:              ptr.To(int32(healthzPort)),
		CgroupDriver:             "cgroupfs",
		CgroupRoot:               "/" + c.cgroupName,
		FailCgroupV1:             ptr.To(false),
		FailSwapOn:               ptr.To(false),
		PodLogsDir:               d("pod-logs"),
		ContainerRuntimeEndpoint: "unix://" + c.containerdSock,
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
	// The mount point of the device-plugin directory.
	if err := makeHostDir(c.cfg.Parent, hostDevicePlugins); err != nil {
		return err
	}
	script := []string{"set -e"}
	for _, s := range sysctls {
		src := filepath.Join("/proc/sys", s)
		b, err := os.ReadFile(src)
		if err != nil {
			continue // a key this kernel does not have
		}
		cp := d("sysctl/" + strings.ReplaceAll(s, "/", "."))
		if err := os.WriteFile(cp, b, 0o644); err != nil {
			return err
		}
		script = append(script, fmt.Sprintf("mount --bind %q %q", cp, src))
	}
	script = append(script,
		fmt.Sprintf("mount --bind %q %q", c.DevicePluginDir, hostDevicePlugins),
		"mount -t tmpfs -o mode=0755,size=16m gpuiso-kubelet-logs /var/log",
		"mkdir /var/log/containers",
		`exec "$@"`)
	args := []string{"--mount", "--propagation", "unchanged", "--", "/bin/sh", "-c", strings.Join(script, "\n"), "kubelet",
		filepath.Join(c.cfg.Bin, "kubelet"), "--config", d("kubelet.json"), "--kubeconfig", c.Kubeconfig,
		"--root-dir", c.KubeletRoot, "--cert-dir", d("pki/kubelet"), "--hostname-override", NodeName, "--v", "2"}
	unshare, err := lookPath("unshare")
	if err != nil {
		return err
	}
	return c.startCmd("kubelet", unshare, nil, args...)
}
