package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/node"
)

// Keeper is what a Source may also be to hold the devices the plugin hands
// out: an *allocator.Allocator. Allocate then holds each whole GPU or MIG
// device for its DeviceOwner, so that no DRA claim on the same allocator
// can take a device a pod of the plugin's has, and Reconcile gives it back
// once no pod holds it. A Source that is not one only has the devices that
// claims hold refused (Holders).
type Keeper interface {
	Claim(ctx context.Context, owner string, devices []node.DeviceRef, opts ...allocator.ClaimOption) (allocator.Allocation, error)
	Allocations() []allocator.Allocation
	Release(ctx context.Context, owner string) error
}

// The allocator is a Keeper (see TimeSlicer).
var _ Keeper = (*allocator.Allocator)(nil)

// DeviceOwner is the allocator's owner of the whole GPU or MIG device the
// kubelet calls id (its UUID), held while a pod has it:
// "deviceplugin-<id>".
func DeviceOwner(id string) string { return devicePrefix + id }

const devicePrefix = "deviceplugin-"

// deviceOfOwner is the device id an owner of DeviceOwner's names.
func deviceOfOwner(owner string) (string, bool) {
	id, ok := strings.CutPrefix(owner, devicePrefix)
	return id, ok && id != ""
}

// holdDevices holds each of devs (whole GPUs or MIG devices) for its
// DeviceOwner, and returns the owners, to give back should the rest of
// the allocation fail. A device its owner holds already (a pod of it
// ended, and Reconcile has not given it back yet) is kept as it is; one
// that another owner holds (a DRA claim) fails with ErrHeld, and what was
// taken is given back.
func (p *Plugin) holdDevices(ctx context.Context, k Keeper, devs []Device) ([]string, error) {
	var took []string
	for _, d := range devs {
		owner := DeviceOwner(d.ID)
		if _, err := k.Claim(ctx, owner, []node.DeviceRef{d.Ref}); err != nil {
			if errors.Is(err, allocator.ErrDeviceUnavailable) {
				err = fmt.Errorf("%w: %w", ErrHeld, err)
			}
			return nil, errors.Join(append([]error{fmt.Errorf("allocate %s: device %s: %w", p.resource, d.ID, err)}, release(ctx, k, took)...)...)
		}
		took = append(took, owner)
		p.book.take(d.ID)
	}
	return took, nil
}

// release gives back owners, and returns what failed.
func release(ctx context.Context, k interface {
	Release(ctx context.Context, owner string) error
}, owners []string) []error {
	var errs []error
	for _, o := range owners {
		if err := k.Release(context.WithoutCancel(ctx), o); err != nil && !errors.Is(err, allocator.ErrUnknownOwner) {
			errs = append(errs, err)
		}
	}
	return errs
}

// Adopt holds in the allocator what the kubelet's pods hold now of the
// manager's resources, as its pod-resources service (Config.PodResources)
// tells: each whole GPU or MIG device for its DeviceOwner, each time slice
// for its TimeSliceOwner, each concurrent slice for its
// ConcurrentSliceOwner, with its GPU's MPS daemon (kept running, or
// started again in place); then, with StrategyMPS, it stops every daemon
// of Config.MPS that no slice held in the allocator explains (a GPU's
// daemon is kept while any slice of it is held). It is how a plugin that starts finds the devices
// handed out before it ran: by a version that did not hold them, or by a
// device plugin since turned off (a Manager that is not Run adopts and
// reconciles all the same), so that no DRA claim takes a GPU a running pod
// has. Reconcile gives them back once their pods end. It returns the
// owners it holds, sorted; a device that another owner holds (a claim
// took it meanwhile) is in the error, and the others are held still. When
// the kubelet cannot be asked, nothing is held.
func (m *Manager) Adopt(ctx context.Context) ([]string, error) {
	k, kok := m.src.(Keeper)
	ts, tok := m.src.(TimeSlicer)
	if !kok && !tok {
		return nil, nil
	}
	inUse, err := devicesInUse(ctx, m.cfg.PodResources, m.resourceNames())
	if err != nil {
		return nil, fmt.Errorf("adopt the devices of running pods: %w", err)
	}
	var held []string
	var errs []error
	for _, p := range m.Plugins() {
		for _, d := range p.Devices() {
			if !inUse[d.ID] {
				continue
			}
			var owner string
			switch {
			case d.TimeSlice && tok:
				owner = TimeSliceOwner(d.Ref.UUID, d.Replica)
				_, err = ts.Claim(ctx, owner, []node.DeviceRef{d.Ref}, allocator.AsShare(allocator.Share{Mode: allocator.ShareTime}))
			case d.Slice && tok && m.cfg.MPS != nil:
				owner = ConcurrentSliceOwner(d.Ref.UUID, d.Replica)
				var al allocator.Allocation
				if al, err = ts.Claim(ctx, owner, []node.DeviceRef{d.Ref}, allocator.AsShare(m.cfg.sliceShare())); err == nil {
					// Its GPU's daemon, found running (the slice joins its
					// tenants) or started again in place.
					_, err = m.cfg.MPS.StartShare(ctx, al)
				}
			case !d.TimeSlice && !d.Slice && kok:
				owner = DeviceOwner(d.ID)
				_, err = k.Claim(ctx, owner, []node.DeviceRef{d.Ref})
			default:
				continue
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("%s of a running pod: %w", d.ID, err))
				continue
			}
			held = append(held, owner)
		}
	}
	slices.Sort(held)
	if len(held) > 0 {
		m.cfg.Logger.Info("held the devices of running pods", "owners", held)
		m.cfg.heldChanged()
	}
	if _, err := m.sweepSlices(ctx); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return held, fmt.Errorf("adopt the devices of running pods: %w", err)
	}
	return held, nil
}

// resourceNames are the resources the manager serves.
func (m *Manager) resourceNames() map[string]bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]bool, len(m.plugins))
	for name := range m.plugins {
		out[name] = true
	}
	return out
}
