package isolator

import (
	"fmt"
	"path/filepath"
	"slices"

	"github.com/opencontainers/runtime-spec/specs-go"
)

// Where a memory share's container finds its MPS control daemon.
const (
	// MPSPipeDir is where the daemon's pipe directory appears in the
	// container: MPS's default, so a client finds it even with
	// CUDA_MPS_PIPE_DIRECTORY unset.
	MPSPipeDir = "/tmp/nvidia-mps"
	// MPSShmDir is where the daemon's shared memory directory appears: the
	// container's /dev/shm, which MPS clients share with their server.
	MPSShmDir = "/dev/shm"
	// EnvMPSPipeDir names the pipe directory to CUDA.
	EnvMPSPipeDir = "CUDA_MPS_PIPE_DIRECTORY"
)

// MPS is the MPS control daemon that enforces a memory share (package
// isolator/mps starts it): what its container needs of it.
type MPS struct {
	// PipeDir is the host directory of the daemon's pipes and sockets,
	// bound read-write at MPSPipeDir.
	PipeDir string `json:"pipeDir"`
	// ShmDir is the host directory the daemon and its server have as
	// /dev/shm, bound read-write at MPSShmDir in place of the container's
	// own: the memory MPS clients share with their server. Package
	// isolator/mps makes both directories bounded tmpfs mounts of their
	// own (mps.DefaultShmBytes, as a container's own /dev/shm), so the
	// bind carries the bound, and what the container writes there counts
	// in its memory cgroup, as its own /dev/shm would.
	ShmDir string `json:"shmDir"`
}

// WithMPS gives the container of a memory share what an MPS client needs of
// its daemon m, and nothing more: the daemon's pipe directory at MPSPipeDir
// and its /dev/shm at MPSShmDir (both nosuid, nodev, noexec), and
// CUDA_MPS_PIPE_DIRECTORY naming the pipe directory. The limits are the
// daemon's; the allocation's environment (NewPlan's env) may only lower
// them. The plan must be of one whole GPU.
func WithMPS(m MPS) PlanOption {
	return func(c *planConfig) error {
		if !filepath.IsAbs(m.PipeDir) || !filepath.IsAbs(m.ShmDir) {
			return fmt.Errorf("MPS directories %q and %q must be absolute: %w", m.PipeDir, m.ShmDir, ErrInvalidMPS)
		}
		m.PipeDir, m.ShmDir = filepath.Clean(m.PipeDir), filepath.Clean(m.ShmDir)
		c.mps = &m
		return nil
	}
}

// addMPS adds the daemon m to p, a plan of one whole GPU.
func addMPS(p *Plan, m MPS) error {
	if len(p.GPUs) != 1 || p.GPUs[0].MIG != nil {
		return fmt.Errorf("an MPS share is of one whole GPU, not %d devices: %w", len(p.GPUs), ErrInvalidMPS)
	}
	opts := []string{"rbind", "rw", "nosuid", "nodev", "noexec"}
	for _, mnt := range []specs.Mount{
		{Source: m.PipeDir, Destination: MPSPipeDir, Type: "bind", Options: slices.Clone(opts)},
		{Source: m.ShmDir, Destination: MPSShmDir, Type: "bind", Options: slices.Clone(opts)},
	} {
		if slices.ContainsFunc(p.Mounts, func(e specs.Mount) bool { return e.Destination == mnt.Destination }) {
			return fmt.Errorf("a mount at %s already: %w", mnt.Destination, ErrInvalidMPS)
		}
		p.Mounts = append(p.Mounts, mnt)
	}
	p.Env = MergeEnv(p.Env, []string{EnvMPSPipeDir + "=" + MPSPipeDir})
	p.MPS = &m
	return nil
}
