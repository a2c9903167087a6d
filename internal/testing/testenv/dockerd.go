package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/moby/moby/client"
)

// Where the host's Docker daemon lives, as .ci/provision.sh starts it.
const (
	dockerdPath    = "/usr/sbin/dockerd"
	dockerdPidFile = "/var/run/docker.pid"
	// containerdPidFile is that of the containerd dockerd starts itself.
	containerdPidFile = "/var/run/docker/containerd/containerd.pid"
	dockerdLog        = "/var/log/gpuiso-dockerd.log"
	dockerLockFile    = "/run/gpuiso-docker-tests.lock"
)

// LockDocker takes the host-wide lock of the Docker daemon's test users
// until tb ends: shared by the tests that only use the daemon, exclusive for
// a test that stops it (see StopDockerd), so that test packages running in
// parallel never see the daemon vanish under them. The exclusive lock needs
// root (it calls RequireRoot); a process that may not create the lock file
// (not root, and no root test made it yet) runs without the shared lock,
// as no such process can stop the daemon either. A test takes it once: a
// second LockDocker in the same process waits for the first.
func LockDocker(tb testing.TB, exclusive bool) {
	tb.Helper()
	if exclusive {
		RequireRoot(tb)
	}
	f, err := os.OpenFile(dockerLockFile, os.O_RDONLY|os.O_CREATE, 0o644)
	if errors.Is(err, os.ErrPermission) && !exclusive {
		return
	}
	if err != nil {
		tb.Fatalf("docker test lock: %v", err)
	}
	how := syscall.LOCK_SH
	if exclusive {
		how = syscall.LOCK_EX
	}
	for {
		err = syscall.Flock(int(f.Fd()), how)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		tb.Fatalf("docker test lock: %v", err)
	}
	tb.Cleanup(func() { f.Close() }) // closing drops the lock
}

// StopDockerd kills the host's Docker daemon (SIGKILL, as a crash would)
// and waits until it no longer answers cli. It returns a function that
// starts the daemon again as .ci/provision.sh does (setsid dockerd, output
// to /var/log/gpuiso-dockerd.log) and waits until it answers cli; that
// function also runs when tb ends, so the daemon runs again after the test
// whatever happens, and running it twice starts the daemon once. The caller
// must hold the exclusive LockDocker.
func StopDockerd(tb testing.TB, cli *client.Client) (start func() error) {
	tb.Helper()
	RequireRoot(tb)
	pid, err := dockerdPid()
	if err != nil {
		tb.Fatalf("stop dockerd: %v", err)
	}
	var once sync.Once
	var startErr error
	start = func() error {
		once.Do(func() { startErr = startDockerd(cli) })
		return startErr
	}
	tb.Cleanup(func() {
		if err := start(); err != nil {
			tb.Errorf("start dockerd again: %v", err)
		}
	})
	// The containerd that dockerd runs itself dies with it.
	dying := []int{pid}
	if b, err := os.ReadFile(containerdPidFile); err == nil {
		if cpid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && parentOf(cpid) == pid {
			dying = append(dying, cpid)
		}
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		tb.Fatalf("stop dockerd %d: %v", pid, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, p := range dying {
		for !isZombie(p) {
			if time.Now().After(deadline) {
				tb.Fatalf("stop dockerd: %d still runs after 30 s", p)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := cli.Ping(ctx, client.PingOptions{}); err == nil {
		tb.Fatal("stop dockerd: a daemon still answers")
	}
	return start
}

// dockerdPid reads the daemon's pid file and checks that the process is
// dockerd.
func dockerdPid() (int, error) {
	b, err := os.ReadFile(dockerdPidFile)
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return 0, fmt.Errorf("%s: bad pid %q", dockerdPidFile, b)
	}
	comm, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "comm"))
	if err != nil {
		return 0, fmt.Errorf("dockerd %d: %w", pid, err)
	}
	if strings.TrimSpace(string(comm)) != "dockerd" {
		return 0, fmt.Errorf("pid %d of %s is %q, not dockerd", pid, dockerdPidFile, strings.TrimSpace(string(comm)))
	}
	return pid, nil
}

// parentOf returns the parent pid of pid, or 0.
func parentOf(pid int) int {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

// isZombie reports whether pid has exited: it is gone or not yet reaped.
func isZombie(pid int) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return true
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && len(s) > i+2 && s[i+2] == 'Z'
}

// startDockerd starts dockerd in its own session and waits up to 60 s for
// it to answer.
func startDockerd(cli *client.Client) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_, err := cli.Ping(ctx, client.PingOptions{})
	cancel()
	if err == nil {
		return nil // already back
	}
	// A killed daemon's pid files stay (its own, and that of the containerd
	// it ran, which dies with it); dockerd refuses to start, or waits for a
	// containerd that never answers, while such a pid names a process, and
	// an unreaped zombie still counts as one.
	for _, pidFile := range []string{dockerdPidFile, containerdPidFile} {
		if b, err := os.ReadFile(pidFile); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && isZombie(pid) {
				if err := os.Remove(pidFile); err != nil && !errors.Is(err, os.ErrNotExist) {
					return err
				}
			}
		}
	}
	log, err := os.OpenFile(dockerdLog, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer log.Close()
	cmd := exec.Command(dockerdPath)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }() // reaps it should it die
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			return fmt.Errorf("dockerd exited: %v (see %s)", err, dockerdLog)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := cli.Ping(ctx, client.PingOptions{NegotiateAPIVersion: true})
		cancel()
		if err == nil {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("dockerd does not answer after 60 s (see %s)", dockerdLog)
}
