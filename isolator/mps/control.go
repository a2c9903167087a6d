package mps

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/record"
)

// ControlBinary is the MPS control daemon's program, which gpuiso runs
// both as each share's daemon and as the client that talks to it.
const ControlBinary = "nvidia-cuda-mps-control"

// controlTimeout bounds one command to a daemon.
const controlTimeout = 10 * time.Second

// Lookup finds the MPS control daemon's binary: in PATH, then in the
// driver's directories under driverRoot ("" means /): usr/bin, bin,
// usr/local/nvidia/bin (where a containerised driver keeps it). None is
// ErrNoControl.
func Lookup(driverRoot string) (string, error) {
	if p, err := exec.LookPath(ControlBinary); err == nil {
		return filepath.Abs(p)
	}
	if driverRoot == "" {
		driverRoot = "/"
	}
	for _, d := range []string{"usr/bin", "bin", "usr/local/nvidia/bin", "usr/sbin"} {
		p := filepath.Join(driverRoot, d, ControlBinary)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s in PATH or under %s: %w", ControlBinary, driverRoot, ErrNoControl)
}

// control sends one command to the daemon whose pipe directory is
// pipeDir (on the host) through the control binary as a client, and
// returns what it printed. A daemon that does not answer is ErrDaemon.
//
// The pipe directory is the container's to write: its root may put links
// there named like the daemon's sockets, pointing at another share's
// daemon or any socket of the host, which a client run as the host's root
// would follow. So the client never resolves a path in that directory:
// each socket is opened there without following a link (an O_PATH handle,
// checked to be a socket: something else in its place is ErrTampered, and
// nothing is sent) and handed to the client, which finds it through a
// directory of the manager's own, that no container sees, holding links to
// the client's own descriptors (/proc/self/fd/N). The client is pointed at
// that directory through /proc/self/fd too (a socket's path is limited to
// 107 bytes, which the manager's directory may pass). Neither the pipe
// directory nor its sockets need to be on the manager's file system: the
// pipe directory is a tmpfs of its own.
func (m *Manager) control(ctx context.Context, pipeDir, command string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, controlTimeout)
	defer cancel()
	priv, err := os.MkdirTemp(m.dir, m.controlPattern())
	if err != nil {
		return "", fmt.Errorf("%q to the daemon of %s: %w", command, pipeDir, err)
	}
	defer os.RemoveAll(priv)
	var socks []*os.File
	defer func() {
		for _, f := range socks {
			f.Close()
		}
	}()
	for _, name := range []string{"control", "control_privileged"} {
		f, err := linux.OpenSocketPath(pipeDir, name)
		switch {
		case errors.Is(err, linux.ErrNotSocket):
			return "", fmt.Errorf("%q to the daemon of %s: %w: %w", command, pipeDir, err, ErrTampered)
		case isNotExist(err) && name != "control":
			continue
		case err != nil:
			return "", fmt.Errorf("%q to the daemon of %s: %w: %w", command, pipeDir, err, ErrDaemon)
		}
		socks = append(socks, f)
		// The client's descriptor 3 is priv, then the sockets in turn.
		if err := os.Symlink("/proc/self/fd/"+strconv.Itoa(3+len(socks)), filepath.Join(priv, name)); err != nil {
			return "", fmt.Errorf("%q to the daemon of %s: %w", command, pipeDir, err)
		}
	}
	dir, err := os.Open(priv)
	if err != nil {
		return "", fmt.Errorf("%q to the daemon of %s: %w", command, pipeDir, err)
	}
	defer dir.Close()
	out, err := run(ctx, m.bin, append([]*os.File{dir}, socks...), command)
	if err != nil {
		return "", fmt.Errorf("%q to the daemon of %s: %w", command, pipeDir, err)
	}
	return out, nil
}

// controlPrefix starts the name of each directory control links a
// daemon's sockets into; controlMaxAge is how long one may be left with a
// name that does not say whose it is (a control ends within controlTimeout).
const (
	controlPrefix = ".control-"
	controlMaxAge = 3 * controlTimeout
)

// controlPattern is the os.MkdirTemp pattern of control's directory:
// the prefix, the calling process ("<pid>.<start>"), so that dropControls
// can tell one whose process was killed mid-command from one in use, then
// a random suffix (linux.OwnedPattern).
func (m *Manager) controlPattern() string {
	self, _ := linux.Self(m.procRoot) // the zero Process where it cannot tell: no owner
	return linux.OwnedPattern(controlPrefix, self)
}

// dropControls removes the directories control left in the manager's
// directory when its process was killed mid-command: those of a process
// that provably ended, and those that do not name one once they are older
// than any command. A directory of a live process is in use and is kept.
func (m *Manager) dropControls() error {
	entries, err := os.ReadDir(m.dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), controlPrefix) || !e.IsDir() {
			continue
		}
		if p, ok := linux.OwnerOfName(e.Name(), controlPrefix); ok {
			if !linux.Dead(m.procRoot, p) {
				continue
			}
		} else if fi, err := e.Info(); err != nil || time.Since(fi.ModTime()) < controlMaxAge {
			continue
		}
		if err := linux.RemoveDir(filepath.Join(m.dir, e.Name())); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// run is control's body: the client, with files as its descriptors 3,
// 4, ...: the directory of links to the sockets first.
func run(ctx context.Context, bin string, files []*os.File, command string) (string, error) {
	var out, errb bytes.Buffer
	cmd := exec.CommandContext(ctx, bin)
	cmd.Env = []string{"CUDA_MPS_PIPE_DIRECTORY=/proc/self/fd/3", "PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.ExtraFiles = files
	cmd.Stdin = strings.NewReader(command + "\n")
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(errb.String() + " " + out.String())
		return "", fmt.Errorf("%v: %s: %w", err, msg, ErrDaemon)
	}
	return strings.TrimSpace(out.String()), nil
}

// parseMemLimit reads a pinned memory limit as the daemon prints it: "<n>M"
// or "<n>G" (the daemon shows a limit of a whole number of GiB or more in
// G, rounded down), as MiB: the least and the most the limit may be.
func parseMemLimit(s string) (lo, hi uint64, err error) {
	s = strings.TrimSpace(s)
	if len(s) < 2 {
		return 0, 0, fmt.Errorf("memory limit %q: %w", s, ErrDaemon)
	}
	n, err := strconv.ParseUint(s[:len(s)-1], 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("memory limit %q: %w", s, ErrDaemon)
	}
	switch s[len(s)-1] {
	case 'M':
		return n, n, nil
	case 'G':
		return n << 10, n<<10 + 1023, nil
	}
	return 0, 0, fmt.Errorf("memory limit %q: %w", s, ErrDaemon)
}

// parsePercent reads an active thread percentage as the daemon prints it
// ("30.0").
func parsePercent(s string) (float64, error) {
	v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil {
		return 0, fmt.Errorf("thread percentage %q: %w", s, ErrDaemon)
	}
	return v, nil
}

// isNotExist tells a missing file, or a missing record, from other errors.
func isNotExist(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, record.ErrNoRecord)
}
