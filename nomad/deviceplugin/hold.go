package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/gpuiso/gpuiso/allocator"
)

// nomadClient reads the node's allocations from the agent's HTTP API.
type nomadClient struct {
	api    *api.Client
	nodeID string // found on first use
}

func newNomadClient(cfg Config) (*nomadClient, error) {
	c := api.DefaultConfig()
	if cfg.NomadAddr != "" {
		c.Address = cfg.NomadAddr
	}
	if cfg.NomadToken != "" {
		c.SecretID = cfg.NomadToken
	}
	cl, err := api.NewClient(c)
	if err != nil {
		return nil, fmt.Errorf("%w: nomad_addr: %w", ErrInvalidConfig, err)
	}
	return &nomadClient{api: cl}, nil
}

// usedDevices returns the device ids that the node's allocations that have
// not ended use.
func (c *nomadClient) usedDevices(ctx context.Context) (map[string]bool, error) {
	q := (&api.QueryOptions{}).WithContext(ctx)
	if c.nodeID == "" {
		self, err := c.api.Agent().Self()
		if err != nil {
			return nil, fmt.Errorf("read the agent: %w", err)
		}
		id := self.Stats["client"]["node_id"]
		if id == "" {
			return nil, errors.New("read the agent: not a Nomad client (no node id)")
		}
		c.nodeID = id
	}
	allocs, _, err := c.api.Nodes().Allocations(c.nodeID, q)
	if err != nil {
		return nil, fmt.Errorf("read the allocations of node %s: %w", c.nodeID, err)
	}
	used := map[string]bool{}
	for _, a := range allocs {
		if a == nil || a.AllocatedResources == nil || ended(a.ClientStatus) {
			continue
		}
		for _, t := range a.AllocatedResources.Tasks {
			if t == nil {
				continue
			}
			for _, d := range t.Devices {
				if d == nil {
					continue
				}
				for _, id := range d.DeviceIDs {
					used[id] = true
				}
			}
		}
	}
	return used, nil
}

// ended tells whether an allocation's client status is final.
func ended(status string) bool {
	switch status {
	case api.AllocClientStatusComplete, api.AllocClientStatusFailed, api.AllocClientStatusLost:
		return true
	}
	return false
}

// keepHolds gives back, every fingerprint period until ctx ends, the
// devices held for reservations that no allocation of the node uses any
// more (see giveBack).
func (st *state) keepHolds(ctx context.Context) {
	t := time.NewTicker(st.cfg.FingerprintPeriod)
	defer t.Stop()
	for {
		if released, err := st.giveBack(ctx); err != nil {
			st.log.Warn("holds kept: the node's allocations cannot be read", "err", err)
		} else if len(released) > 0 {
			st.log.Info("gave back devices no allocation uses", "owners", released)
			st.notify()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// giveBack releases each device owner (DeviceOwner) whose device no
// allocation of the node uses, as the list read now says. A hold made
// after the list was asked for stays (its allocation may not be in the
// list yet); so does every hold while the list cannot be read. It returns
// the owners released.
func (st *state) giveBack(ctx context.Context) ([]string, error) {
	asked := time.Now()
	used, err := st.nomad.usedDevices(ctx)
	if err != nil {
		return nil, err
	}
	st.holdMu.Lock()
	defer st.holdMu.Unlock()
	var released []string
	var errs []error
	for _, a := range st.alloc.Allocations() {
		id, ok := deviceOfOwner(a.Owner)
		if !ok || used[id] {
			continue
		}
		st.mu.Lock()
		at, ok := st.heldAt[id]
		st.mu.Unlock()
		if !ok {
			at = st.started // held before this configuration: by an earlier run
		}
		if !at.Before(asked) {
			continue
		}
		if err := st.alloc.Release(ctx, a.Owner); err != nil && !errors.Is(err, allocator.ErrUnknownOwner) {
			errs = append(errs, err)
			continue
		}
		st.mu.Lock()
		delete(st.heldAt, id)
		st.mu.Unlock()
		st.releaseVolume(ctx, a.Owner)
		released = append(released, a.Owner)
	}
	sort.Strings(released)
	return released, errors.Join(errs...)
}

// releaseVolume forgets owner as a user of the driver volume.
func (st *state) releaseVolume(ctx context.Context, owner string) {
	st.mu.Lock()
	vols, vol := st.vols, st.vol
	st.mu.Unlock()
	if vol == nil {
		return
	}
	if err := vols.Release(ctx, vol.Version, owner); err != nil {
		st.log.Warn("driver volume user not released", "owner", owner, "err", err)
	}
}
