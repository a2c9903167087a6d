package native

import (
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"

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
	Confine  confinement   `json:"confine"`
	// Masked are host directories a container with the host's view must
	// not see (every MPS manager's directory and gpuiso's state
	// directories: only its own daemon's pipe directory, bound by the
	// plan, is the container's).
	Masked []string `json:"masked,omitempty"`
	// ExtraFiles is how many descriptors after the config's (fd 3) the
	// command gets, as its fds 3, 4, ...
	ExtraFiles int `json:"extraFiles,omitempty"`
	// Bare: the init runs in its parent's namespaces and sets nothing up
	// (the package's tests of its bookkeeping, without root).
	Bare bool `json:"bare,omitempty"`
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
	// Whatever the caller of the containerizer left open without
	// close-on-exec came along: it stops here. Only fds 0-2 and the
	// ExtraFiles the spec names reach the command.
	if err := linux.CloseExecFrom(3); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", initName(), err)
		return exitInitFailed
	}
	// The config arrives on fd 3 only after the containerizer has moved
	// this process into the container's cgroup.
	pipe := os.NewFile(3, "init-config")
	var cfg initConfig
	err := json.NewDecoder(pipe).Decode(&cfg)
	pipe.Close()
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: read config: %v\n", initName(), err)
		return exitInitFailed
	}
	// The state directory is opened now: a container with its own root
	// file system leaves the host's behind.
	state, err := os.OpenRoot(filepath.Dir(cfg.ExitFile))
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", initName(), err)
		return exitInitFailed
	}
	defer state.Close()
	code, ran := runCommand(cfg)
	if !ran && code == exitInitFailed {
		return code // the container was not set up: nothing to record
	}
	if err := writeExit(state, cfg.ExitFile, exitRecord{Code: code}); err != nil {
		fmt.Fprintf(os.Stderr, "%s: record exit status: %v\n", initName(), err)
	}
	return code
}

// initName begins the init's own lines: the name of the program whose
// binary it is (gpurun), as that program's other lines begin.
func initName() string { return filepath.Base(os.Args[0]) }

// startRemedy says what to do about a command that could not be started
// with the exit code code.
func startRemedy(code int) string {
	switch code {
	case exitNotFound:
		return ": check the command's name, or give its full path in the container"
	case exitNotRunnable:
		return ": check that it is an executable file of the container"
	}
	return ""
}

// runCommand sets the container up, runs its command confined (see
// startContainer), forwarding signals to it, and returns its exit code
// (128+N when killed by signal N), and whether the command ran.
func runCommand(cfg initConfig) (int, bool) {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, linux.ForwardedSignals()...)
	defer signal.Stop(sigs)
	cmd, code, err := startContainer(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v%s\n", initName(), err, startRemedy(code))
		return code, false
	}
	go func() {
		for s := range sigs {
			cmd.Process.Signal(s)
		}
	}()
	code, ok := linux.ExitCode(cmd.Wait())
	if !ok {
		return exitInitFailed, true
	}
	return code, true
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
