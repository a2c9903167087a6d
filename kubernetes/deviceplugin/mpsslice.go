package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/isolator/cdi"
	"github.com/gpuiso/gpuiso/isolator/mps"
	"github.com/gpuiso/gpuiso/node"
)

// Strategy is how the replicas of a shared GPU (Config.Shared) share it.
type Strategy string

const (
	// StrategyTimeSlicing serves each replica as a time slice
	// (allocator.ShareTime): the pods of a GPU take turns on all of it,
	// and only their number is enforced. The default.
	StrategyTimeSlicing Strategy = "time-slicing"
	// StrategyMPS serves each of a GPU's Config.Replicas replicas as a
	// concurrent slice (allocator.ShareSlice, Slices Replicas): the pods
	// of a GPU are clients of one MPS daemon (Config.MPS), which holds
	// each client process to 1/Replicas of the GPU's memory and threads,
	// and run their kernels at once.
	StrategyMPS Strategy = "mps"
)

// ParseStrategy reads a strategy by its name ("time-slicing", "mps"; ""
// is time slicing). Any other name is ErrInvalidConfig.
func ParseStrategy(name string) (Strategy, error) {
	switch s := Strategy(name); s {
	case "", StrategyTimeSlicing:
		return StrategyTimeSlicing, nil
	case StrategyMPS:
		return s, nil
	}
	return "", fmt.Errorf("sharing strategy %q, want %q or %q: %w", name, StrategyTimeSlicing, StrategyMPS, ErrInvalidConfig)
}

// SliceDaemons runs the MPS daemons of the concurrent slices
// (StrategyMPS): an *mps.Manager. The device plugin's manager should
// have a directory of its own: Adopt sweeps every daemon of it that the
// allocator's slices do not explain.
type SliceDaemons interface {
	// StartShare gives the slice an allocation holds its GPU's daemon:
	// the one daemon of the GPU's slices, started with the first.
	StartShare(ctx context.Context, al allocator.Allocation) (*mps.Daemon, error)
	// Stop drops a slice's owner from its GPU's daemon, which stops
	// with the last.
	Stop(ctx context.Context, owner string) error
	// Sweep stops the daemons keep does not keep.
	Sweep(ctx context.Context, keep func(owner string) bool) ([]string, error)
}

// The MPS manager runs slice daemons (see TimeSlicer).
var _ SliceDaemons = (*mps.Manager)(nil)

// ConcurrentSliceOwner is the allocator's owner of replica k of the GPU
// uuid served as a concurrent slice (StrategyMPS), and the tenant of the
// GPU's MPS daemon: "mpsslice-<uuid>-<k>".
func ConcurrentSliceOwner(uuid string, k int) string {
	return concurrentPrefix + uuid + "-" + strconv.Itoa(k)
}

const concurrentPrefix = "mpsslice-"

// replicaOfOwner is the replica an owner of prefix's names
// (TimeSliceOwner's, ConcurrentSliceOwner's).
func replicaOfOwner(prefix, owner string) (string, bool) {
	rest, ok := strings.CutPrefix(owner, prefix)
	i := strings.LastIndexByte(rest, '-')
	if !ok || i <= 0 {
		return "", false
	}
	k, err := strconv.Atoi(rest[i+1:])
	if err != nil || k < 0 {
		return "", false
	}
	return TimeSliceID(rest[:i], k), true
}

// ConcurrentSlices are the replicas of the GPUs of devs that shared names,
// as TimeSlices gives them, each a concurrent slice of its GPU
// (Device.Slice) instead of a time slice.
func ConcurrentSlices(devs []node.Device, shared []string, replicas int) []Device {
	out := TimeSlices(devs, shared, replicas)
	for i := range out {
		out[i].TimeSlice, out[i].Slice = false, true
	}
	return out
}

// sliceShare is the share a replica is held as under StrategyMPS.
func (c *Config) sliceShare() allocator.Share {
	return allocator.Share{Mode: allocator.ShareSlice, Slices: c.Replicas}
}

// concurrentContainer is Allocate's answer for a container given the
// concurrent slice d: d is held in the allocator for its
// ConcurrentSliceOwner (a replica held already, by a pod that ended, is
// kept as it is), its GPU's daemon is started or found running with the
// slice among its tenants, and the container gets the GPU, the daemon's
// pipe directory and /dev/shm, and CUDA_MPS_PIPE_DIRECTORY and the
// daemon's limits in its environment, as isolator.WithShare renders
// them. On error it gives back what it took.
func (p *Plugin) concurrentContainer(ctx context.Context, d Device) (*pluginapi.ContainerAllocateResponse, error) {
	ts, ok := p.src.(TimeSlicer)
	if !ok || p.cfg.MPS == nil {
		return nil, fmt.Errorf("concurrent slices of %s: no allocator or MPS daemons: %w", p.resource, ErrInvalidConfig)
	}
	owner := ConcurrentSliceOwner(d.Ref.UUID, d.Replica)
	refs := []node.DeviceRef{d.Ref}
	names, err := cdi.Names(p.cfg.CDIKind, refs)
	if err != nil {
		return nil, fmt.Errorf("allocate %s: %w", p.resource, err)
	}
	al, err := ts.Claim(ctx, owner, refs, allocator.AsShare(p.cfg.sliceShare()))
	if err != nil {
		return nil, fmt.Errorf("allocate %s: concurrent slice %s: %w", p.resource, d.ID, err)
	}
	undo := func(err error) error {
		errs := []error{fmt.Errorf("allocate %s: concurrent slice %s: %w", p.resource, d.ID, err)}
		if err := p.cfg.MPS.Stop(context.WithoutCancel(ctx), owner); err != nil {
			// The daemon keeps the slice among its tenants: the slice
			// stays held too, for Reconcile to give back.
			return errors.Join(append(errs, err)...)
		}
		return errors.Join(append(errs, release(ctx, ts, []string{owner})...)...)
	}
	if other, ok := p.otherSlices(d.Ref.UUID); ok {
		// The GPU's slices of the same count that a DRA claim holds have
		// a daemon of the DRA driver's: a second one would serve the
		// GPU beside it.
		return nil, undo(fmt.Errorf("its GPU has the slices of %s: %w", other, ErrHeld))
	}
	dm, err := p.cfg.MPS.StartShare(ctx, al)
	if err == nil && dm == nil {
		err = fmt.Errorf("no MPS daemon for a share %+v: %w", al.Share, ErrInvalidConfig)
	}
	if err != nil {
		return nil, undo(err)
	}
	plan, err := isolator.NewPlan(owner, p.inv, refs, nil, nil, isolator.WithShare(dm))
	if err != nil {
		return nil, undo(err)
	}
	p.book.take(d.ID)
	resp := &pluginapi.ContainerAllocateResponse{Envs: map[string]string{}}
	for _, n := range names {
		resp.CdiDevices = append(resp.CdiDevices, &pluginapi.CDIDevice{Name: n})
	}
	for _, kv := range plan.Env {
		k, v, _ := strings.Cut(kv, "=")
		resp.Envs[k] = v
	}
	for _, m := range plan.Mounts {
		resp.Mounts = append(resp.Mounts, &pluginapi.Mount{ContainerPath: m.Destination, HostPath: m.Source,
			ReadOnly: slices.Contains(m.Options, "ro")})
	}
	if p.cfg.DeviceSpecs {
		for _, n := range plan.Devices {
			resp.Devices = append(resp.Devices, &pluginapi.DeviceSpec{ContainerPath: n.Path, HostPath: n.HostPath, Permissions: "rw"})
		}
	}
	p.cfg.heldChanged()
	return resp, nil
}

// otherSlices tells the first owner of a concurrent slice of the GPU
// uuid that is no replica of the device plugin's (a DRA claim's), if the
// source tells the GPU's shares.
func (p *Plugin) otherSlices(uuid string) (string, bool) {
	sh, ok := p.src.(interface {
		Shares(device string) ([]allocator.Allocation, error)
	})
	if !ok {
		return "", false
	}
	als, err := sh.Shares(uuid)
	if err != nil {
		return "", false
	}
	for _, al := range als {
		if _, ours := replicaOfOwner(concurrentPrefix, al.Owner); !ours && al.Share != nil && al.Share.Mode == allocator.ShareSlice {
			return al.Owner, true
		}
	}
	return "", false
}

// sweepSlices stops the daemons of the manager's MPS directory that no
// concurrent slice the allocator holds explains (mps.Keep with the
// allocator's shares): a GPU's daemon whose slices were all given back
// while its stop failed, or one a crash left. It keeps the daemon of a GPU
// any slice of which is held, and drops from its tenants the slices no
// longer held.
func (m *Manager) sweepSlices(ctx context.Context) ([]string, error) {
	if m.cfg.Strategy != StrategyMPS || m.cfg.MPS == nil {
		return nil, nil
	}
	held, ok := m.src.(mps.Allocations)
	if !ok {
		return nil, nil
	}
	stopped, err := m.cfg.MPS.Sweep(ctx, mps.Keep{Shares: held}.Keeps)
	if len(stopped) > 0 {
		m.cfg.Logger.Info("stopped MPS daemons of no held slice", "owners", stopped)
	}
	if err != nil {
		return stopped, fmt.Errorf("sweep the MPS daemons of the concurrent slices: %w", err)
	}
	return stopped, nil
}
