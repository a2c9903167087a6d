package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuiso/gpuiso/internal/linux"
)

// Containerd is a containerd a test started beside the host's: its own
// socket, root and state directories, the CRI plugin off.
type Containerd struct {
	// Address is its socket, for ctr -a.
	Address string
	// Dir holds its socket, directories, configuration and log.
	Dir string
}

// StartContainerd starts the containerd binary of the Docker installation
// (suite Docker) with a configuration of its own, and waits until ctr
// reaches it. It skips tb where it cannot: not root, or no containerd or
// ctr. When tb ends its tasks and containers are removed and it is
// stopped (SIGTERM, SIGKILL after 30 s).
func StartContainerd(tb testing.TB) *Containerd {
	tb.Helper()
	if !linux.IsRoot() {
		skip(tb, Docker, "a second containerd needs root")
	}
	bin, err := exec.LookPath("containerd")
	if err != nil {
		skip(tb, Docker, "no containerd: %v", err)
	}
	if _, err := exec.LookPath("ctr"); err != nil {
		skip(tb, Docker, "no ctr: %v", err)
	}
	dir, err := os.MkdirTemp("", "gpuiso-containerd-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	c := &Containerd{Address: filepath.Join(dir, "c.sock"), Dir: dir}
	config := fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = %q
[ttrpc]
  address = %q
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), c.Address, c.Address+".ttrpc")
	if err := os.WriteFile(filepath.Join(dir, "config.toml"), []byte(config), 0o644); err != nil {
		tb.Fatal(err)
	}
	log, err := os.Create(filepath.Join(dir, "containerd.log"))
	if err != nil {
		tb.Fatal(err)
	}
	defer log.Close()
	cmd := exec.Command(bin, "--config", filepath.Join(dir, "config.toml"))
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start containerd: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	tb.Cleanup(func() {
		c.teardown()
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		unmountUnder(dir)
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case err := <-exited:
			exited <- err
			b, _ := os.ReadFile(filepath.Join(dir, "containerd.log"))
			tb.Fatalf("containerd exited: %v\n%s", err, b)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := c.Ctr(ctx, "version")
		cancel()
		if err == nil {
			return c
		}
		if time.Now().After(deadline) {
			tb.Fatalf("containerd at %s does not answer after 30 s: %v", c.Address, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Ctr runs ctr against c and returns its combined output; a failure is
// returned with that output.
func (c *Containerd) Ctr(ctx context.Context, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, "ctr", append([]string{"-a", c.Address}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// teardown kills and deletes every task and container of the default
// namespace.
func (c *Containerd) teardown() {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := c.Ctr(ctx, "containers", "list", "-q")
	if err != nil {
		return
	}
	for _, id := range strings.Fields(out) {
		c.Ctr(ctx, "tasks", "kill", "-s", "KILL", id)
		for i := 0; i < 50; i++ {
			if _, err := c.Ctr(ctx, "tasks", "delete", id); err == nil || !strings.Contains(err.Error(), "running") {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		c.Ctr(ctx, "containers", "delete", id)
	}
}
