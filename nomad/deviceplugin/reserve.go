package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/nomad/internal/proto/device"
	"github.com/gpuiso/gpuiso/volume"
)

// Reserve says what a task needs to use the devices ids, which must be
// devices of the last fingerprint, each named once. In devices mode it
// holds each device in the allocator's state (DeviceOwner) and returns its
// device nodes, the control nodes (and a MIG device's capability nodes),
// the driver volume read-only and the environment CUDA needs; in runtime
// mode it returns NVIDIA_VISIBLE_DEVICES alone, for gpuiso-runtime.
func (p *Plugin) Reserve(ctx context.Context, req *device.ReserveRequest) (*device.ReserveResponse, error) {
	st, _ := p.current()
	if st == nil {
		return nil, grpcError(ErrNotConfigured)
	}
	if !st.enter() {
		return nil, grpcError(ErrNotConfigured)
	}
	res, err := st.reserve(ctx, req.GetDeviceIds())
	st.leave()
	if err != nil {
		return nil, grpcError(err)
	}
	return &device.ReserveResponse{ContainerRes: res}, nil
}

// DeviceOwner is the allocator's owner of a device a reservation handed
// out in devices mode, held until no allocation of the node uses it:
// "nomad-<id>".
func DeviceOwner(id string) string { return ownerPrefix + id }

const ownerPrefix = "nomad-"

// deviceOfOwner is the device id of an owner DeviceOwner names.
func deviceOfOwner(owner string) (string, bool) {
	id, ok := strings.CutPrefix(owner, ownerPrefix)
	return id, ok && id != ""
}

func (st *state) reserve(ctx context.Context, ids []string) (*device.ContainerReservation, error) {
	if st.alloc == nil {
		return nil, ErrDisabled
	}
	if len(ids) == 0 {
		return nil, fmt.Errorf("%w: no device", ErrInvalidReserve)
	}
	st.mu.Lock()
	known := st.known
	st.mu.Unlock()
	refs := make([]node.DeviceRef, 0, len(ids))
	seen := map[string]bool{}
	var errs []error
	for _, id := range ids {
		o, ok := known[id]
		switch {
		case seen[id]:
			errs = append(errs, fmt.Errorf("%w: %s named twice", ErrInvalidReserve, id))
		case !ok:
			errs = append(errs, fmt.Errorf("%w: %s", ErrUnknownDevice, id))
		case !o.healthy:
			errs = append(errs, fmt.Errorf("%w: %s is unhealthy: %s", ErrHeld, id, o.reason))
		}
		seen[id] = true
		refs = append(refs, o.ref)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("reserve %s: %w", strings.Join(ids, ","), err)
	}
	if st.cfg.Env == EnvRuntime {
		return &device.ContainerReservation{Envs: map[string]string{isolator.EnvVisibleDevices: strings.Join(ids, ",")}}, nil
	}
	return st.reserveDevices(ctx, ids, refs)
}

// reserveDevices holds the devices and returns what the task gets.
func (st *state) reserveDevices(ctx context.Context, ids []string, refs []node.DeviceRef) (*device.ContainerReservation, error) {
	vols, vol, err := st.volume(ctx)
	if err != nil {
		return nil, fmt.Errorf("reserve %s: %w", strings.Join(ids, ","), err)
	}
	inj := vol.Injection(nil)
	plan, err := isolator.NewPlan(DeviceOwner(ids[0]), st.inv, refs, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("reserve %s: %w", strings.Join(ids, ","), err)
	}
	// Hold each device for its own owner: Nomad has no release call, and
	// each device is given back on its own once no allocation uses it.
	st.holdMu.Lock()
	defer st.holdMu.Unlock()
	var took []string
	for i, id := range ids {
		owner := DeviceOwner(id)
		_, lookErr := st.alloc.Allocation(owner)
		heldBefore := lookErr == nil
		st.mu.Lock()
		prev, hadAt := st.heldAt[id]
		st.heldAt[id] = time.Now()
		st.mu.Unlock()
		_, err := st.alloc.Claim(ctx, owner, refs[i:i+1])
		if err == nil {
			err = vols.Acquire(ctx, vol.Version, owner)
		}
		if err != nil {
			if errors.Is(err, allocator.ErrDeviceUnavailable) {
				err = fmt.Errorf("%w: %w", ErrHeld, err)
			}
			st.mu.Lock()
			if hadAt {
				st.heldAt[id] = prev
			} else {
				delete(st.heldAt, id)
			}
			st.mu.Unlock()
			errs := []error{fmt.Errorf("reserve %s: %w", id, err)}
			for _, o := range took {
				if err := st.alloc.Release(context.WithoutCancel(ctx), o); err != nil && !errors.Is(err, allocator.ErrUnknownOwner) {
					errs = append(errs, err)
				}
			}
			return nil, errors.Join(errs...)
		}
		if !heldBefore {
			took = append(took, owner)
		}
	}
	res := &device.ContainerReservation{Envs: map[string]string{}}
	for _, kv := range append(plan.Env, inj.Env...) {
		k, v, _ := strings.Cut(kv, "=")
		if k == isolator.EnvVisibleDevices || k == "PATH" {
			// NVIDIA_VISIBLE_DEVICES would switch Nomad's docker driver
			// to the NVIDIA runtime; the image keeps its own PATH.
			continue
		}
		res.Envs[k] = v
	}
	res.Mounts = []*device.Mount{{TaskPath: volume.ContainerPath, HostPath: inj.Mount.Source, ReadOnly: true}}
	for _, d := range plan.Devices {
		res.Devices = append(res.Devices, &device.DeviceSpec{TaskPath: d.Path, HostPath: d.HostPath, Permissions: "rwm"})
	}
	return res, nil
}
