package testenv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/gpuiso/gpuiso/internal/linux"
)

// Dockerd is a Docker daemon a test started beside the host's: its own
// socket, data root, exec root, pid file, configuration and bridge, and no
// iptables rules, so that the host's daemon never sees it.
type Dockerd struct {
	// Host is the daemon's address for DOCKER_HOST or docker -H.
	Host string
	// Dir holds its socket, roots, configuration and log (daemon.log).
	Dir string
	// Client talks to it, with a negotiated API version.
	Client *client.Client

	// gwBridge says SwarmInit made the docker_gwbridge link of the host's
	// network namespace, to delete at the end.
	gwBridge bool
}

// SwarmInit makes d a one-node swarm manager listening on 127.0.0.1:port.
// The swarm is left, and the bridge it made in the host's network
// namespace (docker_gwbridge) deleted when the test ends; a bridge that
// existed before is kept.
func (d *Dockerd) SwarmInit(ctx context.Context, port int) error {
	d.gwBridge = exec.Command("ip", "link", "show", "docker_gwbridge").Run() != nil
	_, err := d.Docker(ctx, "swarm", "init", "--advertise-addr", "127.0.0.1", "--listen-addr", fmt.Sprintf("127.0.0.1:%d", port))
	return err
}

// StartDockerd starts the host's dockerd binary with config as its
// configuration file (such as "runtimes" or "node-generic-resources") and
// waits until it answers. It skips tb (suite Docker) where it cannot: not
// root, or no dockerd binary. When tb ends, the daemon's containers are
// removed, a swarm it joined is left, and the daemon is stopped (SIGTERM,
// then SIGKILL after 30 s) before its directory is removed.
func StartDockerd(tb testing.TB, config map[string]any) *Dockerd {
	tb.Helper()
	return StartDockerdWith(tb, DockerdOptions{Config: config})
}

// DockerdOptions say which daemon StartDockerdWith starts, and how.
type DockerdOptions struct {
	// Binary is the dockerd to run (default: the host's, /usr/sbin/dockerd).
	Binary string
	// Path lists directories searched first for the programs the daemon
	// runs (containerd, its shim, runc).
	Path []string
	// Config is the daemon's configuration file, as JSON.
	Config map[string]any
}

// StartDockerdWith is StartDockerd with a daemon binary and the programs
// it runs of the caller's choice.
func StartDockerdWith(tb testing.TB, o DockerdOptions) *Dockerd {
	tb.Helper()
	if !linux.IsRoot() {
		skip(tb, Docker, "a second Docker daemon needs root")
	}
	bin := o.Binary
	if bin == "" {
		bin = dockerdPath
	}
	if _, err := os.Stat(bin); err != nil {
		skip(tb, Docker, "no dockerd binary: %v", err)
	}
	config := o.Config
	if config == nil {
		config = map[string]any{}
	}
	// Short paths: containerd's sockets live under the exec root.
	dir, err := os.MkdirTemp("", "gpuiso-dockerd-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	cfg, err := json.Marshal(config)
	if err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "daemon.json"), cfg, 0o644); err != nil {
		tb.Fatal(err)
	}
	log, err := os.Create(filepath.Join(dir, "daemon.log"))
	if err != nil {
		tb.Fatal(err)
	}
	defer log.Close()
	d := &Dockerd{Host: "unix://" + filepath.Join(dir, "d.sock"), Dir: dir}
	// A bridge of its own: a daemon told "--bridge none" deletes the host's
	// docker0, which the host's daemon needs.
	bridge := ownBridge(tb, dir)
	cmd := exec.Command(bin, "-H", d.Host,
		"--data-root", filepath.Join(dir, "data"), "--exec-root", filepath.Join(dir, "x"),
		"--pidfile", filepath.Join(dir, "d.pid"), "--config-file", filepath.Join(dir, "daemon.json"),
		"--bridge", bridge, "--iptables=false", "--ip6tables=false", "--ip-masq=false")
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if len(o.Path) > 0 {
		cmd.Env = append(os.Environ(), "PATH="+strings.Join(o.Path, ":")+":"+os.Getenv("PATH"))
	}
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start dockerd: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	tb.Cleanup(func() {
		d.teardown(tb)
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		// Anything the daemon left mounted under its roots, and the swarm's
		// bridge in the host's network namespace.
		unmountUnder(dir)
		if d.gwBridge {
			exec.Command("ip", "link", "delete", "docker_gwbridge").Run()
		}
	})
	d.Client, err = client.New(client.WithHost(d.Host))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { d.Client.Close() })
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case err := <-exited:
			exited <- err
			b, _ := os.ReadFile(filepath.Join(dir, "daemon.log"))
			tb.Fatalf("dockerd exited: %v\n%s", err, b)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := d.Client.Ping(ctx, client.PingOptions{NegotiateAPIVersion: true})
		cancel()
		if err == nil {
			return d
		}
		if time.Now().After(deadline) {
			tb.Fatalf("dockerd at %s does not answer after 60 s: %v", d.Host, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Docker runs the docker command line against d and returns its combined
// output; a failure is returned with that output.
func (d *Dockerd) Docker(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "docker", append([]string{"-H", d.Host}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("docker %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// teardown leaves a swarm and removes every container, so that the daemon
// stops without leaving container processes behind.
func (d *Dockerd) teardown(tb testing.TB) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if out, err := d.Docker(ctx, "info", "--format", "{{.Swarm.LocalNodeState}}"); err == nil && strings.TrimSpace(out) == "active" {
		if _, err := d.Docker(ctx, "swarm", "leave", "--force"); err != nil {
			tb.Logf("leave swarm: %v", err)
		}
	}
	out, err := d.Docker(ctx, "ps", "-aq")
	if err != nil {
		return
	}
	if ids := strings.Fields(out); len(ids) > 0 {
		if _, err := d.Docker(ctx, append([]string{"rm", "-f"}, ids...)...); err != nil {
			tb.Logf("remove containers: %v", err)
		}
	}
}

// unmountUnder detaches every mount below dir, deepest first.
func unmountUnder(dir string) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	var points []string
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			points = append(points, f[4])
		}
	}
	for i := len(points) - 1; i >= 0; i-- {
		if err := syscall.Unmount(points[i], syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
			continue
		}
	}
}

// ownBridge makes a bridge link for a second daemon, named after dir and
// addressed in the benchmarking range 198.18.0.0/15 (RFC 2544), which no
// network of the host uses; it is deleted when tb ends, after the daemon
// stopped.
func ownBridge(tb testing.TB, dir string) string {
	tb.Helper()
	var sum uint32
	for _, c := range []byte(dir) {
		sum = sum*31 + uint32(c)
	}
	name := fmt.Sprintf("gpuisobr%d", sum%10000)
	addr := fmt.Sprintf("198.18.%d.1/24", sum%250)
	for _, args := range [][]string{{"link", "add", name, "type", "bridge"}, {"addr", "add", addr, "dev", name}, {"link", "set", name, "up"}} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			exec.Command("ip", "link", "delete", name).Run()
			tb.Fatalf("bridge %s: ip %s: %v: %s", name, strings.Join(args, " "), err, out)
		}
	}
	tb.Cleanup(func() { exec.Command("ip", "link", "delete", name).Run() })
	return name
}
