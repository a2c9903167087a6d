package mps

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// ServerBinary is the MPS server's program, which a control daemon starts
// by name (through its PATH) for each user whose client connects, running
// as that user.
const ServerBinary = "nvidia-cuda-mps-server"

// daemonServerDir is where a daemon's namespace holds the copy of the
// server it runs (on its own tmpfs at /tmp), first in its PATH.
const daemonServerDir = "/tmp/nvidia-mps-server"

// serverMode is the copy's: any user may run it, none but root may read
// it. The kernel makes a process that runs a program its user cannot read
// non-dumpable (with fs.suid_dumpable at its default, 0): its private
// /proc/<pid> entries (environ, fd, root, cwd, mem) become root's, and only
// a process with CAP_SYS_PTRACE in the host's user namespace may trace it
// or reach its mount namespace through them. A server run from the
// driver's own program, which its user may read, is within reach of every
// host process of its client's uid.
const serverMode os.FileMode = 0o111

// serverSource opens the driver's server program, as the manager sees it:
// beside the control binary, or in the directories its daemons search
// (under the driver root, then /). None is ErrNoServer.
func (m *Manager) serverSource() (*os.File, error) {
	dirs := []string{filepath.Dir(m.bin)}
	roots := []string{m.driverRoot, m.hostRoot}
	if m.hostRoot == "" {
		roots[1] = "/"
	}
	for i, root := range roots {
		if root == "" || i == 1 && root == roots[0] {
			continue
		}
		for _, d := range searchDirs {
			dirs = append(dirs, filepath.Join(root, d))
		}
	}
	for _, d := range dirs {
		f, err := os.Open(filepath.Join(d, ServerBinary))
		if err != nil {
			continue
		}
		if fi, err := f.Stat(); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return f, nil
		}
		f.Close()
	}
	return nil, fmt.Errorf("%s beside %s or in %s: %w", ServerBinary, m.bin, strings.Join(dirs[1:], ":"), ErrNoServer)
}

// searchDirs are the directories of a root in which a daemon looks for
// the server (its PATH, after the control binary's own).
var searchDirs = []string{"usr/local/nvidia/bin", "usr/local/sbin", "usr/local/bin", "usr/sbin", "usr/bin", "sbin", "bin"}
