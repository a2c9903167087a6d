package containerizer

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/isolator/mps"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/volume"
)

// Preparer is the one step every back end runs before it starts a
// container: it turns a Spec into a Prepared, what the container gets.
// Its fields are fixed before first use; it is safe for concurrent use.
type Preparer struct {
	// Allocator hands out the GPUs (required); its inventory
	// (Allocator.Inventory) is the node the plans are made for.
	Allocator *allocator.Allocator
	// Volumes provides the driver volume; nil means no container gets one
	// (an image that asks for it is then refused with ErrNoVolume).
	Volumes *volume.Manager
	// SysRoot is the host's sysfs, where a spec asking for CPUAffinityNUMA
	// finds its NUMA nodes' CPUs (default /sys).
	SysRoot string
	// MPS starts the MPS control daemon of each memory share (package
	// isolator/mps); nil means memory shares are refused with ErrNoMPS.
	MPS *mps.Manager
}

// Image is what the back end knows of a container's image: its labels and
// environment (from the image's configuration), and whether the container
// has its own root file system (an image, or a native container with a
// root file system) and where that lies on the host, when it can be read.
type Image struct {
	Labels map[string]string
	Env    []string
	// OwnRoot says the container does not share the host's root file
	// system. Only such a container may get the driver volume: mounted over
	// a shared root it would hide the host's own driver.
	OwnRoot bool
	// RootFS is the host path of the container's root file system, when the
	// back end can read it ("" for a Docker image): CUDA forward
	// compatibility is decided from its /usr/local/cuda/compat.
	RootFS string
	// Compat, when set, is CUDA forward compatibility as the caller
	// decided it beforehand (volume.CompatFor, outside any lock): RootFS is
	// then not read.
	Compat *volume.Compat
}

// WantsVolume reports whether a container of img, with env set over the
// image's, gets the driver volume: only with a root file system of its own,
// and only when the image asks for it (the com.nvidia.volumes.needed label,
// or NVIDIA_VISIBLE_DEVICES set and not void).
func (img Image) WantsVolume(env []string) bool {
	return img.OwnRoot && volume.Image{Labels: img.Labels, Env: isolator.MergeEnv(img.Env, env)}.NeedsVolume()
}

// Prepared is what a container gets, ready for a back end to run: the
// allocation, the isolation plan (device nodes and rules, mounts and the
// environment to set over the image's), and the driver volume when it has
// one. Undo gives back everything Prepare took.
type Prepared struct {
	// Allocation is what the container holds; it names no device for a
	// container without GPUs.
	Allocation allocator.Allocation
	// Plan is the container's isolation. Its Env is what the container's
	// environment must gain over the image's and the spec's.
	Plan *isolator.Plan
	// Env is the container's whole environment, merged here once: the
	// image's (Image.Env), the spec's over it, the plan's over both. A
	// runtime that sets a container's environment whole (native) uses it
	// as it is.
	Env []string
	// Volume is the driver volume the container uses, or nil.
	Volume *volume.Volume
	// Daemon is the MPS control daemon of a memory share, or nil.
	Daemon *mps.Daemon
	// MPSDir is where the MPS daemons of the node keep their state
	// (Preparer.MPS), or "": a runtime whose containers see the host's
	// file system hides it from every container.
	MPSDir string

	undo []func(context.Context) error
}

// Undo gives back what Prepare took, newest first: the volume use, then a
// memory share's MPS daemon, then the allocation. It runs to the end and returns every failure.
func (p *Prepared) Undo(ctx context.Context) error {
	var errs []error
	for _, u := range slices.Backward(p.undo) {
		errs = append(errs, u(ctx))
	}
	p.undo = nil
	return errors.Join(errs...)
}

// ErrNoVolume: the image asks for the driver volume and the back end has no
// volume manager.
var ErrNoVolume = node.Sentinel(node.ErrNotSupported, "the image needs the driver volume and none is configured")

// Prepare turns spec into what its container gets, in order, each step with
// its undo: the image's NVIDIA_REQUIRE_* conditions on
// the driver, before anything is held; the allocation (a spec asking for no
// GPU holds nothing and gets every GPU denied); the conditions on the
// allocated devices (a MIG device is checked as its parent GPU: its
// architecture and brand); the driver volume, only for a container with its
// own root file system whose image asks for it; and the plan
// (isolator.NewPlan), whose environment names the allocated devices
// none) over the volume's variables and, for a memory share, its MPS
// daemon's directories and client limits (isolator.WithShare); for a spec that asks for it
// (CPUAffinityNUMA), the plan also holds the CPUs and memory nodes local to
// its GPUs. On error nothing is held.
//
// spec.ID is trusted to be a valid owner id (node.ValidateOwner): the
// caller's door checks it once (Lifecycle.Launch, the chain isolator, the
// runtime hook); the allocator, the volume manager and NewPlan refuse one
// that is not before they take anything for it.
func (pr *Preparer) Prepare(ctx context.Context, spec Spec, img Image) (p *Prepared, err error) {
	if pr == nil || pr.Allocator == nil {
		return nil, fmt.Errorf("prepare: no allocator: %w", node.ErrInvalid)
	}
	inv := pr.Allocator.Inventory()
	if inv == nil {
		return nil, fmt.Errorf("prepare: the allocator has no inventory: %w", node.ErrInvalid)
	}
	opts, err := PlanOptions(spec.CPUAffinity, pr.SysRoot)
	if err != nil {
		return nil, err
	}
	p = &Prepared{Allocation: allocator.Allocation{Owner: spec.ID}}
	if pr.MPS != nil {
		p.MPSDir = pr.MPS.Dir()
	}
	defer func() {
		if err != nil {
			p.Undo(context.WithoutCancel(ctx))
			p = nil
		}
	}()

	wantsGPUs := !NoGPUs(spec.GPUs)
	// Requirements are read from the image's environment with the spec's
	// over it, as the container will have it: merged once, for the
	// requirements, the volume's need and its injection.
	req := volume.Image{Labels: img.Labels, Env: isolator.MergeEnv(img.Env, spec.Env)}
	drv := volume.Driver{Version: inv.DriverVersion, CUDA: inv.CUDAVersion}
	if err := volume.Check(req, drv, nil); err != nil {
		return p, err
	}
	needsVolume := img.OwnRoot && req.NeedsVolume()
	if needsVolume && pr.Volumes == nil {
		return p, ErrNoVolume
	}

	if wantsGPUs {
		al, err := pr.Allocator.Allocate(ctx, spec.ID, spec.GPUs)
		if err != nil {
			return p, err
		}
		p.Allocation = al
		p.undo = append(p.undo, func(ctx context.Context) error { return pr.Allocator.Release(ctx, spec.ID) })
		if err := volume.Check(req, drv, devices(inv, al.Devices)); err != nil {
			return p, err
		}
		if err := pr.startDaemon(ctx, p); err != nil {
			return p, err
		}
		opts = append(opts, isolator.WithShare(p.Daemon))
	}

	var mounts []specs.Mount
	var env []string
	if needsVolume {
		vol, err := pr.Volumes.Build(ctx)
		if err != nil {
			return p, fmt.Errorf("driver volume: %w", err)
		}
		if err := pr.Volumes.Acquire(ctx, vol.Version, spec.ID); err != nil {
			return p, fmt.Errorf("driver volume: %w", err)
		}
		p.undo = append(p.undo, func(ctx context.Context) error { return pr.Volumes.Release(ctx, vol.Version, spec.ID) })
		var compat volume.Compat
		if img.Compat != nil {
			compat = *img.Compat
		} else if compat, err = volume.CompatFor(ctx, img.RootFS, vol.Version, nil); err != nil {
			return p, fmt.Errorf("cuda compatibility: %w", err)
		}
		inj := vol.InjectionCompat(req.Env, compat)
		mounts = []specs.Mount{{Source: inj.Mount.Source, Destination: inj.Mount.Destination, Type: inj.Mount.Type, Options: inj.Mount.Options}}
		env = inj.Env
		p.Volume = vol
	}
	plan, err := isolator.NewPlan(spec.ID, inv, p.Allocation.Devices, mounts, env, opts...)
	if err != nil {
		return p, err
	}
	p.Plan = plan
	p.Env = isolator.MergeEnv(req.Env, plan.Env)
	return p, nil
}

// PlanOptions are the plan options a spec's CPU affinity asks for, the
// NUMA nodes' CPUs read under sysRoot ("" means /sys): what Prepare gives
// NewPlan, and what a back end that makes a container's plan again (after
// a restart, for other GPUs) must give it too.
func PlanOptions(a CPUAffinity, sysRoot string) ([]isolator.PlanOption, error) {
	switch a {
	case CPUAffinityNone:
		return nil, nil
	case CPUAffinityNUMA:
		return []isolator.PlanOption{isolator.WithCPUAffinity(sysRoot)}, nil
	}
	return nil, fmt.Errorf("%w: CPU affinity %q", ErrInvalidSpec, a)
}

// NoGPUs reports whether r asks for nothing: such a container holds nothing
// in the allocator and gets no GPU.
func NoGPUs(r allocator.Request) bool {
	//lint:ignore SA1019 the older spelling of a memory share still asks for one
	return r.Count == 0 && len(r.Devices) == 0 && r.MemoryBytes == 0 && r.Share == nil && r.MIG == "" && r.MIGMemoryBytes == 0
}

// ErrNoMPS: a memory share was asked of a back end that has no MPS daemon
// manager (Preparer.MPS, LifecycleConfig.MPS), so nothing would hold the
// container to its share. It is mps.ErrNoManager, the one value every
// program that starts shares' daemons returns.
var ErrNoMPS = mps.ErrNoManager

// startDaemon gives p's memory share its MPS control daemon
// (mps.Manager.StartShare), with its undo; a time slice and whole GPUs need
// none.
func (pr *Preparer) startDaemon(ctx context.Context, p *Prepared) error {
	d, err := pr.MPS.StartShare(ctx, p.Allocation)
	if err != nil || d == nil {
		return err
	}
	p.Daemon = d
	owner := p.Allocation.Owner
	p.undo = append(p.undo, func(ctx context.Context) error { return pr.MPS.Stop(ctx, owner) })
	return nil
}

// ShareLimits are the MPS limits of memory share s.
//
// Deprecated: mps.LimitsOf derives them and checks them, and
// mps.Manager.StartShare starts a share's daemon from its allocation.
func ShareLimits(s allocator.Share) mps.Limits {
	l, _ := mps.LimitsOf(s) // the limits as s has them, checked or not, as before
	return l
}

// devices returns the GPUs of refs, for requirement checks: a MIG device
// is checked as its parent GPU (its architecture and brand), which the
// reference names by index as it names a whole GPU.
func devices(inv *node.Inventory, refs []node.DeviceRef) []node.Device {
	var out []node.Device
	for _, r := range refs {
		for _, d := range inv.Devices {
			if d.Index == r.Index {
				out = append(out, d.Clone())
			}
		}
	}
	return out
}
