package mps

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/node"
)

// slicePrefix begins the owner name of a slice daemon: SliceOwner.
const slicePrefix = "slices-"

// SliceOwner is the name under which the daemon of the concurrent slices
// of the GPU of UUID uuid is recorded (its directory in the manager's, its
// Daemon.Owner): "slices-<uuid>". Each sliced GPU has one such daemon,
// shared by all its slices.
func SliceOwner(uuid string) string { return slicePrefix + uuid }

// IsSliceOwner reports whether owner names the daemon of a GPU's
// concurrent slices (SliceOwner), and of which GPU.
func IsSliceOwner(owner string) (uuid string, ok bool) {
	uuid, ok = strings.CutPrefix(owner, slicePrefix)
	return uuid, ok && uuid != ""
}

// StartSlice gives tenant's concurrent slice s (allocator.ShareSlice) of
// gpu its daemon and returns it: the one daemon of the GPU's slices
// (SliceOwner), started with the GPU's first slice, with the default
// limits of 1/s.Slices of the GPU (LimitsOf), set and read back as a
// share's are, and tenant recorded among the slices it serves. A daemon
// of the GPU that runs with those limits is returned as it is, after
// tenant is added to its record: a command to it, or a start, is paid by
// the first slice alone. The manager's lock orders concurrent starts, so
// that two slices of one GPU started at once start one daemon. A running
// daemon of the GPU with other limits that serves slices still is
// ErrExists. Stop of the last tenant stops the daemon.
func (m *Manager) StartSlice(ctx context.Context, tenant string, gpu node.DeviceRef, s allocator.Share) (Daemon, error) {
	if s.Mode != allocator.ShareSlice {
		return Daemon{}, fmt.Errorf("start the MPS daemon of %s's slice: a share of mode %q: %w", tenant, s.Mode, ErrInvalid)
	}
	lim, err := LimitsOf(s)
	if err != nil {
		return Daemon{}, fmt.Errorf("start the MPS daemon of %s's slice: %w", tenant, err)
	}
	d, err := m.startAs(ctx, SliceOwner(gpu.UUID), gpu, lim, s.Slices, tenant)
	if err != nil {
		return Daemon{}, fmt.Errorf("start the MPS daemon of %s's slice: %w", tenant, err)
	}
	return d, nil
}

// withTenant is tenants with tenant added (none when ""), sorted.
func withTenant(tenants []string, tenant string) []string {
	out := slices.Clone(tenants)
	if tenant != "" && !slices.Contains(out, tenant) {
		out = append(out, tenant)
	}
	slices.Sort(out)
	return out
}

// leave drops tenant from the slice daemon that serves it, if one does,
// and stops that daemon when tenant was its last. The caller holds the
// lock.
func (m *Manager) leave(ctx context.Context, tenant string) error {
	owners, err := m.owners()
	if err != nil {
		return err
	}
	for _, o := range owners {
		if _, ok := IsSliceOwner(o); !ok {
			continue
		}
		r, err := m.readRecord(o)
		if err != nil || !slices.Contains(r.Tenants, tenant) {
			continue
		}
		rest := slices.DeleteFunc(slices.Clone(r.Tenants), func(t string) bool { return t == tenant })
		if len(rest) == 0 {
			return m.stop(ctx, r.Daemon)
		}
		return m.write(r.Daemon, rest)
	}
	return nil
}

// sliceHolders is what Keep reads of an allocator to explain a slice
// daemon: the shares of a GPU (allocator.Allocator.Shares).
type sliceHolders interface {
	Shares(device string) ([]allocator.Allocation, error)
}

// keepsSlices reports whether shares holds a concurrent slice of the GPU
// of UUID uuid.
func keepsSlices(shares Allocations, uuid string) bool {
	sh, ok := shares.(sliceHolders)
	if !ok {
		return false
	}
	als, err := sh.Shares(uuid)
	if err != nil {
		return false
	}
	for _, al := range als {
		if al.Share != nil && al.Share.Mode == allocator.ShareSlice {
			return true
		}
	}
	return false
}
