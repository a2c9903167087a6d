package mps

import (
	"context"
	"fmt"
	"strconv"

	"github.com/gpuiso/gpuiso/allocator"
)

// Limits are what a daemon holds its share's container to.
type Limits struct {
	// MemoryBytes is the device memory each client process may pin
	// (set_default_device_pinned_mem_limit), rounded down to whole MiB.
	MemoryBytes uint64 `json:"memoryBytes"`
	// ComputePercent is the active thread percentage of each client
	// (set_default_active_thread_percentage); 0 means no limit.
	ComputePercent int `json:"computePercent,omitempty"`
}

// LimitsOf are the limits of share s, the share an allocation holds: its
// memory and its compute percentage, checked here and nowhere else (Start
// checks them again). Those of a concurrent slice (allocator.ShareSlice)
// are its daemon's defaults, which each of its GPU's slices gets: its
// memory (the GPU's divided by its count, as the allocation has it) and
// the GPU's compute divided by its count, rounded down to a whole
// percentage (25 for 4 slices, 33 for 3). Anything but a memory share of
// at least 1 MiB with a compute percentage from 0 to 100, or a slice of at
// least 1 MiB whose count is from allocator.MinSlices to
// allocator.MaxSlices, is ErrInvalid; the limits are returned with the
// error all the same, as s has them.
func LimitsOf(s allocator.Share) (Limits, error) {
	l := Limits{MemoryBytes: s.MemoryBytes, ComputePercent: s.ComputePercent}
	if s.Mode == allocator.ShareSlice {
		if s.Slices < allocator.MinSlices || s.Slices > allocator.MaxSlices || s.ComputePercent != 0 {
			return l, fmt.Errorf("a slice of %d (compute %d%%), want %d to %d slices and no compute of its own: %w", s.Slices, s.ComputePercent, allocator.MinSlices, allocator.MaxSlices, ErrInvalid)
		}
		l.ComputePercent = 100 / s.Slices
		return l, l.validate()
	}
	if s.Mode != "" && s.Mode != allocator.ShareMemory {
		return l, fmt.Errorf("a share of mode %q has no MPS limits: %w", s.Mode, ErrInvalid)
	}
	return l, l.validate()
}

// validate is the one check of a share's limits: at least 1 MiB of memory,
// a compute percentage from 0 (no limit) to 100.
func (l Limits) validate() error {
	if l.MemoryBytes < 1<<20 {
		return fmt.Errorf("memory limit %d bytes, want at least 1 MiB: %w", l.MemoryBytes, ErrInvalid)
	}
	if l.ComputePercent < 0 || l.ComputePercent > 100 {
		return fmt.Errorf("compute percentage %d, want 1 to 100 (0: no limit): %w", l.ComputePercent, ErrInvalid)
	}
	return nil
}

func (l Limits) mib() uint64 { return l.MemoryBytes >> 20 }

// Env is what a container held to l carries, sorted ("KEY=value"): the
// MPS client limits CUDA_MPS_PINNED_DEVICE_MEM_LIMIT (in whole MiB, as the
// daemon holds them) and, with a compute percentage,
// CUDA_MPS_ACTIVE_THREAD_PERCENTAGE. A client can only lower these below
// its daemon's; the daemon's are what holds.
func (l Limits) Env() []string {
	var env []string
	if l.ComputePercent > 0 {
		env = append(env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="+strconv.Itoa(l.ComputePercent))
	}
	return append(env, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0="+strconv.FormatUint(max(l.mib(), 1), 10)+"M")
}

// setLimits gives d's daemon its limits and reads them back.
func (m *Manager) setLimits(ctx context.Context, d Daemon) error {
	mib := strconv.FormatUint(d.Limits.mib(), 10)
	if _, err := m.control(ctx, d.PipeDir, "set_default_device_pinned_mem_limit 0 "+mib+"M"); err != nil {
		return err
	}
	if d.Limits.ComputePercent > 0 {
		if _, err := m.control(ctx, d.PipeDir, "set_default_active_thread_percentage "+strconv.Itoa(d.Limits.ComputePercent)); err != nil {
			return err
		}
	}
	got, err := m.query(ctx, d)
	if err != nil {
		return err
	}
	if !got.holds(d.Limits) {
		return fmt.Errorf("daemon %d holds %+v after being given %+v: %w", d.Pid, got, d.Limits, ErrDaemon)
	}
	return nil
}

// Held is what a daemon says it holds: its default pinned memory limit
// (as a range of MiB: it prints whole GiB rounded down) and its default
// active thread percentage.
type Held struct {
	MemoryMinMiB, MemoryMaxMiB uint64
	ComputePercent             float64
	// MemorySet is false when the daemon has no memory limit at all.
	MemorySet bool
}

// holds tells whether h is what l asks for.
func (h Held) holds(l Limits) bool {
	want := float64(l.ComputePercent)
	if l.ComputePercent == 0 {
		want = 100
	}
	return h.MemorySet && h.MemoryMinMiB <= l.mib() && l.mib() <= h.MemoryMaxMiB && h.ComputePercent == want
}

// query asks d's daemon for its limits.
func (m *Manager) query(ctx context.Context, d Daemon) (Held, error) {
	var h Held
	mem, err := m.control(ctx, d.PipeDir, "get_default_device_pinned_mem_limit 0")
	if err != nil {
		return h, err
	}
	if mem != "" {
		if h.MemoryMinMiB, h.MemoryMaxMiB, err = parseMemLimit(mem); err != nil {
			return h, err
		}
		h.MemorySet = true
	}
	pct, err := m.control(ctx, d.PipeDir, "get_default_active_thread_percentage")
	if err != nil {
		return h, err
	}
	if h.ComputePercent, err = parsePercent(pct); err != nil {
		return h, err
	}
	return h, nil
}

// Held asks owner's running daemon what it holds: the limits it applies
// to the next server it starts. A container that reaches the daemon's
// control socket can change them (see the package documentation); Held is
// how to tell.
func (m *Manager) Held(ctx context.Context, owner string) (Held, error) {
	if err := m.made(); err != nil {
		return Held{}, err
	}
	d, err := m.read(owner)
	if isNotExist(err) {
		return Held{}, fmt.Errorf("limits of %s: %w", owner, ErrUnknownOwner)
	}
	if err != nil {
		return Held{}, fmt.Errorf("limits of %s: %w", owner, err)
	}
	if !d.Alive {
		return Held{}, fmt.Errorf("limits of %s: daemon %d is not running: %w", owner, d.Pid, ErrDaemon)
	}
	h, err := m.query(ctx, d)
	if err != nil {
		return Held{}, fmt.Errorf("limits of %s: %w", owner, err)
	}
	return h, nil
}
