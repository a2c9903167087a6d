package cluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

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
	_, err := c.startCmd(name, filepath.Join(c.cfg.Bin, name), env, args...)
	return err
}

// startCmd starts path as the cluster's process name, its output in
// logs/<name>.log. It dies with the test process (SIGKILL).
func (c *Cluster) startCmd(name, path string, env []string, args ...string) (*proc, error) {
	logPath := filepath.Join(c.Dir, "logs", name+".log")
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer log.Close()
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Env = append(os.Environ(), env...)
	cmd.Dir = c.Dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	if id, err := linux.ProcessOf("", cmd.Process.Pid); err == nil {
		p.id = id
	}
	go func() {
		cmd.Wait()
		close(p.done)
	}()
	c.procs = append(c.procs, p)
	return p, nil
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

// Ctr runs ctr against the first node's containerd in namespace k8s.io.
func (c *Cluster) Ctr(ctx context.Context, stdin []byte, args ...string) (string, error) {
	if !c.owns() || c.cfg.Bin == "" || len(c.Nodes) == 0 {
		return "", ErrNotStarted
	}
	return c.CtrOn(ctx, c.Nodes[0], stdin, args...)
}

// CtrOn runs ctr against node n's containerd in namespace k8s.io.
func (c *Cluster) CtrOn(ctx context.Context, n *Node, stdin []byte, args ...string) (string, error) {
	if !c.owns() || c.cfg.Bin == "" || n == nil {
		return "", ErrNotStarted
	}
	cmd := exec.CommandContext(ctx, filepath.Join(c.cfg.Bin, "ctr"), append([]string{"-a", n.containerdSock, "-n", "k8s.io"}, args...)...)
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
