package docker

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/gpuiso/gpuiso/containerizer"
	isodocker "github.com/gpuiso/gpuiso/isolator/docker"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/volume"
)

// Recover adopts the containers of the containerizer's namespace that the
// daemon still has, with their GPUs, and releases what was held for those
// that vanished (see the package documentation). A container that cannot be
// adopted is left alone and reported in the joined error (matching
// ErrNotManaged); the others are adopted all the same.
func (z *Containerizer) Recover(ctx context.Context) ([]containerizer.Container, error) {
	if z.cli == nil || z.alloc == nil {
		return nil, fmt.Errorf("recover: %w", containerizer.ErrNotMade)
	}
	list, err := z.cli.ContainerList(ctx, client.ContainerListOptions{
		All:     true,
		Filters: make(client.Filters).Add("label", LabelNamespace+"="+z.cfg.namespace),
	})
	if err != nil {
		return nil, fmt.Errorf("recover: %w", daemonErr("list containers", err))
	}
	var errs []error
	found := map[string]*entry{}
	listed := map[string]bool{} // owners with a container, adopted or not
	for _, s := range list.Items {
		owner, gpus, err := isodocker.ParseLabels(s.Labels)
		if err != nil {
			errs = append(errs, fmt.Errorf("recover container %s: %w: %w", s.ID, ErrNotManaged, err))
			continue
		}
		listed[owner] = true
		if sup, h := z.supervision(s.Labels); sup == supLive {
			// Another live process's: its GPUs stay held, it stays its.
			if err := z.claim(ctx, s.Labels, &h); err != nil {
				errs = append(errs, fmt.Errorf("recover container %s: %w", s.ID, err))
			}
			continue
		}
		if _, dup := found[owner]; dup {
			errs = append(errs, fmt.Errorf("recover container %s: %w: owner %s has another container", s.ID, ErrNotManaged, owner))
			continue
		}
		if err := z.reclaim(ctx, owner, gpus); err != nil {
			errs = append(errs, fmt.Errorf("recover container %s: %w: %w", s.ID, ErrNotManaged, err))
			continue
		}
		e := &entry{c: containerizer.Container{ID: owner, Kind: containerizer.KindDocker, GPUs: gpus, RuntimeID: s.ID, State: containerizer.StateRunning}}
		if v := s.Labels[LabelVolume]; v != "" && z.cfg.volumes != nil {
			e.version = v
			e.c.Volume = filepath.Join(z.cfg.volumes.Root(), volume.Prefix+v)
			if err := z.cfg.volumes.Acquire(ctx, v, owner); err != nil {
				errs = append(errs, fmt.Errorf("recover %s: %w", owner, err))
			}
		}
		switch s.State {
		case container.StateRunning, container.StatePaused, container.StateRestarting:
		default:
			insp, err := z.cli.ContainerInspect(ctx, s.ID, client.ContainerInspectOptions{})
			if err != nil {
				if cerrdefs.IsNotFound(err) {
					continue // removed meanwhile: released below
				}
				return nil, fmt.Errorf("recover: %w", daemonErr("inspect container", err))
			}
			if st := insp.Container.State; st != nil && !st.Running {
				e.exit = &containerizer.ExitStatus{Code: st.ExitCode}
				e.c.State = containerizer.StateExited
			}
		}
		found[owner] = e
	}

	var vanished []*entry
	for _, x := range z.containers.List(false) {
		if x.State == containerizer.StateDestroying {
			continue // its Destroy is at it
		}
		if f, ok := found[x.ID]; !ok || f.c.RuntimeID != x.Value.c.RuntimeID {
			if !listed[x.ID] {
				vanished = append(vanished, x.Value)
			}
			z.containers.Delete(x.ID)
		}
	}
	for id, f := range found {
		old, _, err := z.containers.Get(id)
		if err == nil {
			z.mu.Lock()
			same := old.c.RuntimeID == f.c.RuntimeID
			if same {
				// Known already: keep its output stream and exit status.
				old.c.GPUs, old.version = f.c.GPUs, f.version
				if f.exit != nil && old.exit == nil {
					old.exit = f.exit
				}
			}
			z.mu.Unlock()
			if same && f.exit != nil {
				_, _ = z.containers.Exited(id, old)
			}
			continue // the same container, or one launching or being destroyed
		}
		if err := z.containers.Adopt(id, f.c.State, f); err != nil {
			errs = append(errs, fmt.Errorf("recover: %w", err))
		}
	}
	for _, e := range vanished {
		if err := z.release(ctx, e.c.ID, e.version); err != nil {
			errs = append(errs, fmt.Errorf("recover: release vanished %s: %w", e.c.ID, err))
		}
	}
	if z.cfg.reconcile {
		live := slices.Collect(maps.Keys(listed))
		for _, x := range z.containers.List(true) {
			if x.State == containerizer.StateLaunching {
				live = append(live, x.ID) // a launch in flight holds its GPUs
			}
		}
		if _, err := z.alloc.Reconcile(ctx, live); err != nil {
			errs = append(errs, fmt.Errorf("recover: %w", err))
		}
	}
	return z.Containers(), errors.Join(errs...)
}

// reclaim makes sure the allocator holds exactly gpus for owner.
func (z *Containerizer) reclaim(ctx context.Context, owner string, gpus []node.DeviceRef) error {
	_, err := z.alloc.Claim(ctx, owner, gpus)
	return err
}
