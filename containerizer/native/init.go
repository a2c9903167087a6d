package native

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gpuiso/gpuiso/internal/linux"
)

// initEnv marks a process started as a container's init.
const initEnv = "GPUISO_NATIVE_INIT"

// initConfig is what the containerizer sends the init once the init is in
// the container's cgroup.
type initConfig struct {
	Args     []string      `json:"args"`
	Env      []string      `json:"env"`
	Dir      string        `json:"dir,omitempty"`
	DevDir   string        `json:"devDir"`
	Mounts   []specs.Mount `json:"mounts,omitempty"`
	ExitFile string        `json:"exitFile"`
}

// Init runs the container's init when the process was started as one, and
// returns at once otherwise. Programs that launch native containers call it
// first thing in main (tests: in TestMain), because the containerizer starts
// its own binary again as each container's init.
func Init() {
	if os.Getenv(initEnv) != "1" {
		return
	}
	os.Exit(runInit())
}

// Exit codes of the init itself, as shells use them.
const (
	exitInitFailed  = 125 // the init could not set the container up
	exitNotRunnable = 126 // the command was found but could not run
	exitNotFound    = 127 // the command was not found
)

func runInit() int {
	// The config arrives on fd 3 only after the containerizer has moved
	// this process into the container's cgroup.
	pipe := os.NewFile(3, "init-config")
	var cfg initConfig
	err := json.NewDecoder(pipe).Decode(&cfg)
	pipe.Close()
	if err != nil {
		fmt.Fprintf(os.Stderr, "gpuiso init: read config: %v\n", err)
		return exitInitFailed
	}
	if err := setupMounts(cfg); err != nil {
		fmt.Fprintf(os.Stderr, "gpuiso init: %v\n", err)
		return exitInitFailed
	}
	code := runCommand(cfg)
	if err := writeJSON(cfg.ExitFile, exitRecord{Code: code}); err != nil {
		fmt.Fprintf(os.Stderr, "gpuiso init: record exit status: %v\n", err)
	}
	return code
}

// setupMounts runs in the container's new mount namespace: nothing it mounts
// reaches the host's.
func setupMounts(cfg initConfig) error {
	if err := linux.MakeRSlave("/"); err != nil {
		return err
	}
	if err := linux.BindMount(cfg.DevDir, "/dev", false); err != nil {
		return err
	}
	if err := linux.MountDevpts("/dev/pts"); err != nil {
		return err
	}
	if err := linux.MountTmpfs("/dev/shm", 0o1777); err != nil {
		return err
	}
	for _, m := range cfg.Mounts {
		if err := linux.BindMount(m.Source, m.Destination, slices.Contains(m.Options, "ro")); err != nil {
			return err
		}
	}
	return nil
}

// runCommand runs the container's command, forwarding signals to it, and
// returns its exit code (128+N when killed by signal N).
func runCommand(cfg initConfig) int {
	path, err := lookPath(cfg.Args[0], cfg.Env)
	if err != nil {
		fmt.Fprintf(os.Stderr, "gpuiso init: %v\n", err)
		return exitNotFound
	}
	cmd := exec.Command(path, cfg.Args[1:]...)
	cmd.Args[0] = cfg.Args[0]
	cmd.Env, cmd.Dir = cfg.Env, cfg.Dir
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2)
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "gpuiso init: %v\n", err)
		if errors.Is(err, fs.ErrNotExist) {
			return exitNotFound // a path naming nothing
		}
		return exitNotRunnable
	}
	go func() {
		for s := range sigs {
			cmd.Process.Signal(s)
		}
	}()
	err = cmd.Wait()
	signal.Stop(sigs)
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	if err != nil {
		return exitInitFailed
	}
	return 0
}

// lookPath finds name on the PATH of the container's environment.
func lookPath(name string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	path := "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range filepath.SplitList(path) {
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: not found in PATH %s", name, path)
}
