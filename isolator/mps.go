package isolator

import (
	"fmt"
	"path/filepath"
	"slices"

	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gpuiso/gpuiso/isolator/mps"
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

// WithShare gives the container of a memory share what it needs of d, the
// share's MPS control daemon (mps.Manager.StartShare), and nothing more:
// the daemon's pipe directory at MPSPipeDir and its /dev/shm at MPSShmDir
// (both nosuid, nodev, noexec), CUDA_MPS_PIPE_DIRECTORY naming the pipe
// directory, and the share's client limits (mps.Limits.Env), which can
// only lower the daemon's. A nil d (whole GPUs, MIG devices held whole, a
// time slice) adds nothing. The plan must be of one GPU or one MIG device
// (a share of a MIG device, whose daemon serves it alone).
func WithShare(d *mps.Daemon) PlanOption {
	return func(c *planConfig) error {
		if d == nil {
			return nil
		}
		if err := withMPS(c, MPS{PipeDir: d.PipeDir, ShmDir: d.ShmDir}); err != nil {
			return err
		}
		c.mpsEnv = d.Limits.Env()
		return nil
	}
}

// WithMPS gives the container of a memory share its daemon m's pipe
// directory and /dev/shm, and CUDA_MPS_PIPE_DIRECTORY, as WithShare does,
// without the share's client limits.
//
// Deprecated: use WithShare, which takes the daemon and adds its client
// limits too.
func WithMPS(m MPS) PlanOption {
	return func(c *planConfig) error { return withMPS(c, m) }
}

func withMPS(c *planConfig, m MPS) error {
	if !filepath.IsAbs(m.PipeDir) || !filepath.IsAbs(m.ShmDir) {
		return fmt.Errorf("MPS directories %q and %q must be absolute: %w", m.PipeDir, m.ShmDir, ErrInvalidMPS)
	}
	m.PipeDir, m.ShmDir = filepath.Clean(m.PipeDir), filepath.Clean(m.ShmDir)
	c.mps = &m
	return nil
}

// addMPS adds the daemon m to p, a plan of one whole GPU or one MIG
// device, with env, the share's client limits.
func addMPS(p *Plan, m MPS, env []string) error {
	if len(p.GPUs) != 1 {
		return fmt.Errorf("an MPS share is of one GPU or MIG device, not %d devices: %w", len(p.GPUs), ErrInvalidMPS)
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
	p.Env = MergeEnv(p.Env, append(slices.Clone(env), EnvMPSPipeDir+"="+MPSPipeDir))
	p.MPS = &m
	return nil
}
