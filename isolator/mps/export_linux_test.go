package mps

import (
	"os/exec"

	"github.com/gpuiso/gpuiso/internal/linux"
)

// SetStartDaemon has m start its daemons' processes with fn, for a test
// that plays a kernel the host's is not.
func SetStartDaemon(m *Manager, fn func(*exec.Cmd, []linux.NamespaceMount) error) {
	m.startFn = fn
}

// SetHostRoot has m look for the MPS server under root instead of /, for a
// test of a node without one.
func SetHostRoot(m *Manager, root string) {
	m.hostRoot = root
}
