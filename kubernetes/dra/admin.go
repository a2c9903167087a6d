package dra

import (
	"context"
	"fmt"
	"slices"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/node"
)

// resultDevice is what the claim's checkpoint records of r, one of the
// claim's results of this driver, after its configuration is checked: a
// share's id and memory go in cp.Share; a device allocated with admin
// access is marked so, and holds nothing.
func (d *Driver) resultDevice(claim *resourceapi.ResourceClaim, r resourceapi.DeviceRequestAllocationResult, byName, shares map[string]string, cp *Checkpoint) (PreparedDevice, error) {
	pd := PreparedDevice{Requests: []string{r.Request}, Pool: r.Pool, Device: r.Device, Admin: r.AdminAccess != nil && *r.AdminAccess}
	cfg, cerr := d.configOf(claim, r)
	uuid, share := shares[r.Device]
	switch {
	case share && pd.Admin:
		// An administrator's claim of a shared GPU watches the GPU: no
		// share of its memory, no MPS daemon.
		pd.UUID = uuid
	case share:
		if cerr != nil {
			// A share's bad configuration was always ErrInvalidShare.
			return PreparedDevice{}, fmt.Errorf("%w: %w", ErrInvalidShare, cerr)
		}
		if err := checkConfig(cfg, r.Request, r.Device, "share", ""); err != nil {
			return PreparedDevice{}, err
		}
		s, err := d.shareOf(r, cfg)
		if err != nil {
			return PreparedDevice{}, err
		}
		pd.UUID, pd.ShareID, cp.Share = uuid, string(*r.ShareID), &s
	default:
		var ok bool
		if pd.UUID, ok = byName[r.Device]; !ok {
			return PreparedDevice{}, ErrUnknownDevice
		}
	}
	if cerr != nil {
		return PreparedDevice{}, cerr
	}
	if typ, profile, ok := d.deviceType(r.Device); ok && !pd.Admin {
		if err := checkConfig(cfg, r.Request, r.Device, typ, profile); err != nil {
			return PreparedDevice{}, err
		}
	}
	return pd, nil
}

// hold makes the allocator hold cp's devices under its owner and returns
// them as the allocation whose CDI spec the claim gets. It is the one
// place that asks:
//   - placement: a claim of a dynamic MIG device gets it made at its
//     placement and held (holdMIG);
//   - admin access (KEP-5018): devices allocated with it are not held (an
//     administrator's claim watches devices that other claims may hold,
//     and its unprepare gives back nothing); they are added to the
//     allocation as the inventory has them;
//   - tolerations: a device unhealthy now is held only when the claim
//     tolerates every taint it has (tolerated), as an operator's
//     diagnostic claim does;
//   - a share is held as one.
//
// The caller holds d.mu.
func (d *Driver) hold(ctx context.Context, cp *Checkpoint) (allocator.Allocation, error) {
	if i := slices.IndexFunc(cp.Devices, func(pd PreparedDevice) bool { return pd.MIG != nil }); i >= 0 {
		return d.holdMIG(ctx, cp, i)
	}
	var uuids []string
	for _, pd := range cp.Devices {
		if !pd.Admin {
			uuids = append(uuids, pd.UUID)
		}
	}
	var al allocator.Allocation
	if len(uuids) > 0 {
		accept, err := d.tolerated(cp)
		if err != nil {
			return allocator.Allocation{}, err
		}
		req := allocator.Request{Devices: uuids, AcceptUnhealthy: accept}
		if cp.Share != nil {
			req.Share = cp.Share.share()
		}
		if al, err = d.alloc.Allocate(ctx, cp.Owner, req); err != nil {
			return allocator.Allocation{}, err
		}
		if len(accept) > 0 {
			d.cfg.Logger.Info("holding unhealthy devices for a claim that tolerates their taints", "claim", cp.Namespace+"/"+cp.Name, "devices", accept)
		}
	}
	return d.withAdmin(al, *cp)
}

// reclaim makes the allocator hold exactly the devices a completed claim
// recorded (allocator.Claim, with AsShare for a share: nothing changes when it does),
// and returns them with the admin devices as hold does.
func (d *Driver) reclaim(ctx context.Context, cp Checkpoint) (allocator.Allocation, error) {
	var refs []node.DeviceRef
	for _, pd := range cp.Devices {
		if !pd.Admin {
			refs = append(refs, node.DeviceRef{UUID: pd.UUID})
		}
	}
	var al allocator.Allocation
	var err error
	switch {
	case len(refs) == 0:
	case cp.Share != nil:
		al, err = d.alloc.Claim(ctx, cp.Owner, refs[:1], allocator.AsShare(*cp.Share.share()))
	default:
		al, err = d.alloc.Claim(ctx, cp.Owner, refs)
	}
	if err != nil {
		return allocator.Allocation{}, err
	}
	return d.withAdmin(al, cp)
}

// withAdmin adds cp's admin devices to al, as the inventory has them.
func (d *Driver) withAdmin(al allocator.Allocation, cp Checkpoint) (allocator.Allocation, error) {
	for _, pd := range cp.Devices {
		if !pd.Admin || slices.ContainsFunc(al.Devices, func(r node.DeviceRef) bool { return r.UUID == pd.UUID }) {
			continue
		}
		ref, ok := d.refOf(pd.UUID)
		if !ok {
			return allocator.Allocation{}, fmt.Errorf("admin access to %s (%s): %w", pd.Device, pd.UUID, ErrUnknownDevice)
		}
		al.Devices = append(al.Devices, ref)
	}
	return al, nil
}

// refOf is the allocation form of the GPU or MIG device uuid.
func (d *Driver) refOf(uuid string) (node.DeviceRef, bool) {
	for _, dev := range d.inv.Devices {
		if dev.UUID == uuid && !dev.MIGSplit() {
			return dev.Ref(), true
		}
		for _, m := range dev.MIGDevices {
			if m.UUID == uuid {
				return dev.MIGRef(m), true
			}
		}
	}
	return node.DeviceRef{}, false
}
