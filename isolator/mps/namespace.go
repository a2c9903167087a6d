package mps

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/gpuiso/gpuiso/internal/linux"
)

// WithMountNamespace makes each daemon's mount namespace from the one
// nsFile names (/proc/<pid>/ns/mnt) instead of the manager's own: for a
// manager in a container, whose namespace holds the container's mounts,
// which its removal takes from under a daemon whose namespace was copied
// from it. A kubelet plugin in a pod names its container runtime's (the
// node's). The manager's directory must be at the same path in both
// namespaces. driverRoot is where that namespace has the driver root the
// manager has at WithDriverRoot: a control binary found under the
// manager's root runs from there, and the daemon's PATH and
// LD_LIBRARY_PATH name that namespace's directories ("" for the same
// path).
func WithMountNamespace(nsFile, driverRoot string) Option {
	return func(c *config) error {
		if !filepath.IsAbs(nsFile) {
			return fmt.Errorf("mount namespace %q is not absolute: %w", nsFile, ErrInvalid)
		}
		if driverRoot != "" && !filepath.IsAbs(driverRoot) {
			return fmt.Errorf("driver root %q of the mount namespace is not absolute: %w", driverRoot, ErrInvalid)
		}
		c.mountNS, c.nsDriverRoot = nsFile, driverRoot
		return nil
	}
}

// daemonBin is the control binary as the daemon's namespace names it.
func (m *Manager) daemonBin() string {
	if m.nsDriverRoot == "" || m.driverRoot == "" {
		return m.bin
	}
	rel, err := filepath.Rel(m.driverRoot, m.bin)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return m.bin
	}
	return filepath.Join(m.nsDriverRoot, rel)
}

// startFrom starts a daemon's process in a mount namespace made from the
// manager's, or from WithMountNamespace's.
func (m *Manager) startFrom(cmd *exec.Cmd, mounts []linux.NamespaceMount) error {
	return linux.StartDaemonFrom(cmd, m.mountNS, mounts)
}
