package allocator

import (
	"context"
	"fmt"
	"strings"

	"github.com/gpuiso/gpuiso/node"
)

// MarkUnhealthy stops device (index, UUID or bus id, or a MIG device's
// "MIG-" UUID) from being handed out, with reason, and returns its owners,
// who keep it until they release it. A GPU's owners include those of its
// MIG devices, which go out of service with it.
func (a *Allocator) MarkUnhealthy(ctx context.Context, device, reason string) ([]string, error) {
	if a.inv == nil {
		return nil, ErrNotMade
	}
	owners, err := a.setHealth(ctx, device, node.Unhealthy(reason))
	if err != nil {
		return nil, fmt.Errorf("mark %s unhealthy: %w", device, err)
	}
	return owners, nil
}

// MarkHealthy lets device be handed out again.
func (a *Allocator) MarkHealthy(ctx context.Context, device string) error {
	if a.inv == nil {
		return ErrNotMade
	}
	if _, err := a.setHealth(ctx, device, node.Healthy()); err != nil {
		return fmt.Errorf("mark %s healthy: %w", device, err)
	}
	return nil
}

// Inform notes reason on device, which stays in service: a signal that
// asks for no action of the node (an application's own XID, a slowdown),
// shown with the device (its Health stays Healthy, with Reason set) until
// MarkHealthy or MarkUnhealthy. An unhealthy device is left as it is. The
// note is not kept in the state file: it lasts in this allocator only, and
// goes when the state is read again after another process changed it.
func (a *Allocator) Inform(ctx context.Context, device, reason string) error {
	if a.inv == nil {
		return ErrNotMade
	}
	if strings.TrimSpace(reason) == "" {
		return fmt.Errorf("note on %s: empty reason: %w", device, node.ErrInvalid)
	}
	if _, err := a.setHealthIf(ctx, device, node.Health{Healthy: true, Reason: reason}, true); err != nil {
		return fmt.Errorf("note on %s: %w", device, err)
	}
	return nil
}

func (a *Allocator) setHealth(ctx context.Context, device string, h node.Health) ([]string, error) {
	return a.setHealthIf(ctx, device, h, false)
}

// setHealthIf sets device's health to h; with onlyHealthy, only when it is
// healthy now (an unhealthy device is left as it is).
func (a *Allocator) setHealthIf(ctx context.Context, device string, h node.Health, onlyHealthy bool) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if node.IsMIGUUID(strings.TrimSpace(device)) {
		a.mu.Lock()
		defer a.mu.Unlock()
		k, ok := a.migUnitOf(device)
		if !ok {
			return nil, fmt.Errorf("MIG device %q: %w", device, ErrUnknownDevice)
		}
		if onlyHealthy && !a.mig.health[k].Healthy {
			return nil, nil
		}
		return a.setMIGHealth(ctx, k, h)
	}
	p, err := a.resolve(device)
	if err != nil {
		return nil, err
	}
	unlock, err := a.lock(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if onlyHealthy && !a.health[p].Healthy {
		return nil, nil
	}
	return a.setHealthLocked(ctx, p, h)
}

func (a *Allocator) setHealthLocked(ctx context.Context, p int, h node.Health) ([]string, error) {
	old := a.health[p]
	a.health[p] = h
	if err := a.persist(ctx, func() { a.health[p] = old }); err != nil {
		return nil, err
	}
	a.cfg.logger.Info("device health", "device", a.inv.Devices[p].Index, "health", h.String())
	return a.ownersOf(p), nil
}
