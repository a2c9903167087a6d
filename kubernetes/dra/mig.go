package dra

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/node"
)

var (
	// ErrMIGClaim: a claim allocated a dynamic MIG device (a placement of
	// a GPU partitioned on demand) beside other devices of this driver, or
	// with admin access: a claim's MIG device is made for it alone.
	ErrMIGClaim = node.Sentinel(node.ErrNotSupported, "a claim of a dynamic MIG device holds no other device of the driver")
	// ErrNoMIGManager: a dynamic MIG device is to be made, and the
	// allocator has no MIG manager that places devices
	// (allocator.WithMIGManager with an allocator.MIGPlacer).
	ErrNoMIGManager = node.Sentinel(node.ErrNotSupported, "dynamic MIG needs a MIG manager")
)

// PreparedMIG is the MIG device a claim's placement device was made as:
// profile at memory slice Start (Size slices) of GPU Parent, recorded
// before it is made (so a preparation cut short knows what it may have
// made) and, once made, with its instance ids; PreparedDevice.UUID is then
// its "MIG-" UUID.
type PreparedMIG struct {
	Parent  string `json:"parent"`
	Profile string `json:"profile"`
	Start   int    `json:"start"`
	Size    int    `json:"size"`
	GI      int    `json:"gi,omitempty"`
	CI      int    `json:"ci,omitempty"`
}

// MIGPlacementDestroyer destroys the GPU instance at a placement of a GPU
// (the one whose first memory slice is start), its compute instances
// first when it has any. A creation cut short after NVML made the GPU
// instance and before it made its compute instance leaves a GPU instance
// that no discovery lists as a MIG device (it has no "MIG-" UUID): only
// its placement finds it. No instance there is an error matching
// node.ErrNotFound.
type MIGPlacementDestroyer interface {
	DestroyMIGAt(ctx context.Context, parent string, start int) error
}

// madeMIG are the MIG devices the driver made for claims, by UUID. A
// device is made and recorded here under its lock, and the node's devices
// are read under it for the slice (view), so that a device just made is
// never published as a user's.
type madeMIG struct {
	mu    sync.Mutex
	uuids map[string]bool
}

func (m *madeMIG) addLocked(uuid string) {
	if m.uuids == nil {
		m.uuids = map[string]bool{}
	}
	m.uuids[uuid] = true
}

func (m *madeMIG) add(uuid string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.addLocked(uuid)
}

// making runs fn, which makes a MIG device and returns its UUID, and
// records the device, under the lock.
func (m *madeMIG) making(fn func() (string, error)) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	uuid, err := fn()
	if err != nil {
		return err
	}
	m.addLocked(uuid)
	return nil
}

// view reads the node's devices (devices) and returns them with the MIG
// devices made for claims that still exist; one that is gone (destroyed)
// is forgotten.
func (m *madeMIG) view(devices func() []node.Device) ([]node.Device, map[string]bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	devs := devices()
	exists := map[string]bool{}
	for _, d := range devs {
		for _, mig := range d.MIGDevices {
			exists[mig.UUID] = true
		}
	}
	out := map[string]bool{}
	for u := range m.uuids {
		if exists[u] {
			out[u] = true
		} else {
			delete(m.uuids, u)
		}
	}
	return devs, out
}

// checkDynamicMIG checks that every GPU opts.DynamicMIG names is one of
// inv with MIG enabled.
func checkDynamicMIG(inv *node.Inventory, opts SliceOptions) error {
	for _, u := range opts.DynamicMIG {
		if !slices.ContainsFunc(inv.Devices, func(d node.Device) bool { return d.UUID == u && d.MIGSplit() && len(d.MIGProfiles) > 0 }) {
			return fmt.Errorf("dynamic MIG GPU %q: not a GPU of the node with MIG enabled: %w", u, ErrInvalidConfig)
		}
		if slices.Contains(opts.Shared, u) {
			return fmt.Errorf("GPU %q both shared and partitioned by dynamic MIG: %w", u, ErrInvalidConfig)
		}
	}
	return nil
}

// placementDevice reads r when it is a device of a GPU partitioned by
// dynamic MIG that does not exist yet: a placement (its MIG device made
// in hold) or the GPU whole. ok is false for any other device. The
// driver's opaque configurations of the request must hold for it (a
// GPUConfig's MIG profiles, checkConfig), as for any device.
func (d *Driver) placementDevice(claim *resourceapi.ResourceClaim, r resourceapi.DeviceRequestAllocationResult) (pd PreparedDevice, ok bool, err error) {
	for _, dev := range d.inv.Devices {
		if !d.cfg.Slice.partitioned(dev) {
			continue
		}
		pd = PreparedDevice{Requests: []string{r.Request}, Pool: r.Pool, Device: r.Device}
		typ, profile := "", ""
		if r.Device == DeviceName(dev) {
			pd.UUID, typ = dev.UUID, "gpu"
		}
		for _, pl := range placements(dev) {
			if r.Device == PlacementDeviceName(dev, pl.profile.Name, pl.at.Start) {
				pd.MIG = &PreparedMIG{Parent: dev.UUID, Profile: pl.profile.Name, Start: pl.at.Start, Size: pl.at.Size}
				typ, profile = "mig", pl.profile.Name
			}
		}
		if typ == "" {
			continue
		}
		if r.AdminAccess != nil && *r.AdminAccess {
			return PreparedDevice{}, true, fmt.Errorf("admin access to a device of a GPU partitioned on demand: %w", ErrMIGClaim)
		}
		cfg, err := d.configOf(claim, r)
		if err == nil {
			err = checkConfig(cfg, r.Request, r.Device, typ, profile)
		}
		if err != nil {
			return PreparedDevice{}, true, err
		}
		return pd, true, nil
	}
	return PreparedDevice{}, false, nil
}

// holdMIG holds the dynamic MIG device of cp (cp.Devices[i]): it is made
// at its placement and held (allocator.AllocateMIGAt, which refuses a GPU
// held whole), and the checkpoint records the made device's UUID and
// instance ids before anything else happens. The caller holds d.mu.
func (d *Driver) holdMIG(ctx context.Context, cp *Checkpoint, i int) (allocator.Allocation, error) {
	if len(cp.Devices) > 1 || cp.Share != nil {
		return allocator.Allocation{}, fmt.Errorf("%d devices of this driver with a dynamic MIG device: %w", len(cp.Devices), ErrMIGClaim)
	}
	pm := cp.Devices[i].MIG
	var al allocator.Allocation
	err := d.mig.making(func() (string, error) {
		var err error
		al, err = d.alloc.AllocateMIGAt(ctx, cp.Owner, allocator.MIGAt{Parent: pm.Parent, Profile: pm.Profile, Start: pm.Start})
		if errors.Is(err, node.ErrNotSupported) {
			err = fmt.Errorf("%w: %w", ErrNoMIGManager, err)
		}
		if err != nil {
			return "", err
		}
		return al.Devices[0].UUID, nil
	})
	if err != nil {
		return allocator.Allocation{}, err
	}
	ref := al.Devices[0]
	cp.Devices[i].UUID = ref.UUID
	if ref.MIG != nil {
		pm.GI, pm.CI = ref.MIG.GI, ref.MIG.CI
	}
	if err := d.cps.write(*cp); err != nil {
		return allocator.Allocation{}, err
	}
	return al, nil
}

// planInventory is the inventory a plan of al is checked against: the
// allocator's, which has the MIG devices made since the driver started,
// when al holds one the driver's does not.
func (d *Driver) planInventory(al allocator.Allocation) *node.Inventory {
	for _, r := range al.Devices {
		if r.MIG != nil && !slices.ContainsFunc(d.inv.Devices, func(dev node.Device) bool {
			return slices.ContainsFunc(dev.MIGDevices, func(m node.MIGDevice) bool { return m.UUID == r.UUID })
		}) {
			return d.alloc.Inventory()
		}
	}
	return d.inv
}

// takeOverMIG makes cp's owner hold, as created on demand, the MIG devices
// cp recorded that the allocator does not hold for it: a preparation cut
// short between the MIG manager making the device and the allocator
// recording it left one at the recorded placement (with the recorded UUID
// when the checkpoint has it), held by nobody. Releasing the owner then
// destroys it. A placement with no such device may still hold a GPU
// instance without a compute instance: it is destroyed through
// Config.MIGDestroyer. The caller holds d.mu.
func (d *Driver) takeOverMIG(ctx context.Context, cp Checkpoint) error {
	if _, err := d.alloc.Allocation(cp.Owner); err == nil {
		return nil // the allocator recorded it: Release destroys it
	}
	var errs []error
	for _, pd := range cp.Devices {
		pm := pd.MIG
		if pm == nil {
			continue
		}
		uuid := ""
		for _, dev := range d.alloc.Devices() {
			if dev.UUID != pm.Parent {
				continue
			}
			for _, m := range dev.MIGDevices {
				if m.Placement.Start != pm.Start || m.Profile != pm.Profile || (pd.UUID != "" && m.UUID != pd.UUID) {
					continue
				}
				if owners, err := d.alloc.Owners(m.UUID); err == nil && len(owners) == 0 {
					uuid = m.UUID
				}
			}
		}
		if uuid != "" {
			if _, err := d.alloc.Claim(ctx, cp.Owner, []node.DeviceRef{{UUID: uuid}}, allocator.Created()); err != nil {
				errs = append(errs, fmt.Errorf("take over MIG device %s made for claim %s: %w", uuid, cp.UID, err))
				continue
			}
			d.cfg.Logger.Info("found a MIG device made for a preparation cut short", "claim", cp.Namespace+"/"+cp.Name, "mig", uuid)
			continue
		}
		if d.cfg.MIGDestroyer == nil {
			continue
		}
		err := d.cfg.MIGDestroyer.DestroyMIGAt(ctx, pm.Parent, pm.Start)
		switch {
		case err == nil:
			d.cfg.Logger.Info("destroyed a GPU instance made for a preparation cut short", "claim", cp.Namespace+"/"+cp.Name, "gpu", pm.Parent, "start", pm.Start)
		case !errors.Is(err, node.ErrNotFound):
			errs = append(errs, fmt.Errorf("destroy the GPU instance at %d of %s made for claim %s: %w", pm.Start, pm.Parent, cp.UID, err))
		}
	}
	return errors.Join(errs...)
}

// restoreMIG brings the MIG devices made for claims in line with the
// checkpoints, at start: the devices of prepared claims are the driver's
// (their placements stand for them in the slice); a preparation cut short
// that recorded a dynamic MIG device is rolled back now, destroying the
// device if it was made; and a claim's owner that the allocator still has
// with no checkpoint left is released, destroying what was made for it.
// MIG devices of anyone else are never touched. The caller holds d.mu.
func (d *Driver) restoreMIG(ctx context.Context, uids []string) error {
	if len(d.cfg.Slice.DynamicMIG) == 0 {
		return nil
	}
	var errs []error
	for _, uid := range uids {
		cp, ok, err := d.cps.read(uid)
		if err != nil || !ok || !slices.ContainsFunc(cp.Devices, func(pd PreparedDevice) bool { return pd.MIG != nil }) {
			continue // a corrupt one is reported by Restore
		}
		if cp.State == StatePrepareCompleted {
			for _, pd := range cp.Devices {
				if pd.MIG != nil && pd.UUID != "" {
					d.mig.add(pd.UUID)
				}
			}
			continue
		}
		if err := d.rollback(ctx, cp); err != nil {
			errs = append(errs, fmt.Errorf("roll back claim %s with a dynamic MIG device: %w", uid, err))
		}
	}
	partitioned := map[string]bool{}
	for _, dev := range d.inv.Devices {
		if d.cfg.Slice.partitioned(dev) {
			partitioned[dev.UUID] = true
		}
	}
	for _, al := range d.alloc.Allocations() {
		uid, ok := claimOf(al.Owner)
		if !ok || d.cps.exists(uid) {
			continue
		}
		if !slices.ContainsFunc(al.Devices, func(r node.DeviceRef) bool { return r.MIG != nil && partitioned[r.MIG.ParentUUID] }) {
			continue
		}
		if err := d.alloc.Release(ctx, al.Owner); err != nil && !errors.Is(err, allocator.ErrUnknownOwner) {
			errs = append(errs, fmt.Errorf("release %s, which no claim explains: %w", al.Owner, err))
			continue
		}
		d.cfg.Logger.Info("released MIG devices of no prepared claim", "owner", al.Owner)
	}
	return errors.Join(errs...)
}
