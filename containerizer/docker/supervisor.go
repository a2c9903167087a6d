package docker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	isodocker "github.com/gpuiso/gpuiso/isolator/docker"
)

// LabelSupervisor names the process that runs a container and whose death
// ends it, "<pid>.<start time>" (see WithSupervisor).
const LabelSupervisor = "io.gpuiso.supervisor"

// WithSupervisor makes h, a process (see allocator.ProcessHolder), the
// supervisor of every container the containerizer launches: the container
// carries it in LabelSupervisor, and its GPUs are held with h as their
// holder unless the spec's request names another. A program that runs
// containers only while it lives (dockerrun) passes its own process; once
// it is dead, Clean (of any containerizer on the namespace) removes its
// containers and gives back what they held.
func WithSupervisor(h allocator.Holder) Option {
	return func(c *config) error {
		if h.Pid <= 0 || h.Start == 0 {
			return fmt.Errorf("supervisor pid %d started at %d: %w", h.Pid, h.Start, allocator.ErrInvalidRequest)
		}
		c.supervisor = &h
		return nil
	}
}

func formatSupervisor(h allocator.Holder) string {
	return strconv.Itoa(h.Pid) + "." + strconv.FormatUint(h.Start, 10)
}

// parseSupervisor reads a LabelSupervisor value.
func parseSupervisor(v string) (allocator.Holder, bool) {
	p, s, ok := strings.Cut(v, ".")
	pid, err1 := strconv.Atoi(p)
	start, err2 := strconv.ParseUint(s, 10, 64)
	if !ok || err1 != nil || err2 != nil || pid <= 0 || start == 0 {
		return allocator.Holder{}, false
	}
	return allocator.Holder{Pid: pid, Start: start}, true
}

// supervised says how a container's supervisor label reads: none (an
// agent's container), this containerizer's own, another live process's, or
// a provably dead process's.
type supervised int

const (
	supNone supervised = iota
	supSelf
	supLive
	supDead
)

func (z *Containerizer) supervision(labels map[string]string) (supervised, allocator.Holder) {
	h, ok := parseSupervisor(labels[LabelSupervisor])
	switch {
	case !ok:
		return supNone, h
	case z.cfg.supervisor != nil && h == *z.cfg.supervisor:
		return supSelf, h
	case h.Dead(""):
		return supDead, h
	}
	return supLive, h
}

// Clean removes what dead supervisors left on the containerizer's
// namespace (see WithSupervisor), and makes the allocator hold what live
// ones run: it is the recovery of programs that run their containers only
// while they live, as Recover is that of an agent whose containers outlive
// it. In order:
//
//  1. it notes the allocator's owners whose holder is provably dead (before
//     listing, so that a run dead by then has no container the listing
//     misses);
//  2. every container of the namespace whose supervisor is provably dead,
//     or whose owner is one of those, is force-removed, and its GPUs and its
//     use of the driver volume are given back;
//  3. the containers of other live supervisors have their GPUs claimed
//     (allocator.Claim, with the supervisor as holder where the allocator
//     had lost them): the daemon is the truth when the allocator's state was
//     lost;
//  4. the dead owners left without a container give back their GPUs and
//     their uses of the volume.
//
// Containers without a supervisor, and this containerizer's own, are left
// alone. Clean returns the owners it cleaned up, sorted; errors are joined,
// and one container that cannot be cleaned does not stop the others. When
// several processes share the allocator's state directory, run Clean and
// the Launch that follows it in one allocator.Exclusive, so that no other
// process acts in between.
func (z *Containerizer) Clean(ctx context.Context) ([]string, error) {
	if z.cli == nil || z.alloc == nil {
		return nil, fmt.Errorf("clean: %w", containerizer.ErrNotMade)
	}
	dead := map[string]bool{}
	for _, al := range z.alloc.Allocations() {
		if al.Holder != nil && al.Holder.Dead("") {
			dead[al.Owner] = true
		}
	}
	list, err := z.cli.ContainerList(ctx, client.ContainerListOptions{
		All:     true,
		Filters: make(client.Filters).Add("label", LabelNamespace+"="+z.cfg.namespace),
	})
	if err != nil {
		return nil, fmt.Errorf("clean: %w", daemonErr("list containers", err))
	}
	var cleaned []string
	var errs []error
	for _, s := range list.Items {
		owner := s.Labels[isodocker.LabelOwner]
		sup, h := z.supervision(s.Labels)
		switch {
		case sup == supDead || dead[owner]:
			z.cfg.logger.InfoContext(ctx, "removing a container whose supervisor died", "id", owner, "container", s.ID)
			_, err := z.cli.ContainerRemove(ctx, s.ID, client.ContainerRemoveOptions{Force: true})
			if err != nil && !cerrdefs.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("clean %s: %w", owner, daemonErr("remove container", err)))
				continue
			}
			delete(dead, owner)
			if owner == "" {
				continue
			}
			if err := z.releaseAll(ctx, owner, s.Labels[LabelVolume]); err != nil {
				errs = append(errs, fmt.Errorf("clean %s: %w", owner, err))
			}
			cleaned = append(cleaned, owner)
		case sup == supLive:
			if err := z.claim(ctx, s.Labels, &h); err != nil {
				errs = append(errs, fmt.Errorf("clean: container %.12s: %w", s.ID, err))
			}
		}
	}
	for owner := range dead {
		if err := z.releaseAll(ctx, owner, ""); err != nil {
			errs = append(errs, fmt.Errorf("clean %s: %w", owner, err))
			continue
		}
		cleaned = append(cleaned, owner)
	}
	slices.Sort(cleaned)
	return slices.Compact(cleaned), errors.Join(errs...)
}

// claim makes the allocator hold the GPUs a container's labels name for
// its owner; holder, if not nil, holds them when they had to be claimed
// again.
func (z *Containerizer) claim(ctx context.Context, labels map[string]string, holder *allocator.Holder) error {
	owner, gpus, err := isodocker.ParseLabels(labels)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrNotManaged, err)
	}
	al, err := z.alloc.Claim(ctx, owner, gpus)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrNotManaged, err)
	}
	if holder != nil && al.Holder == nil && len(al.Devices) > 0 {
		return z.alloc.SetHolder(ctx, owner, holder)
	}
	return nil
}

// releaseAll gives back owner's GPUs and its use of the volume version
// ("": of every version).
func (z *Containerizer) releaseAll(ctx context.Context, owner, version string) error {
	if version != "" || z.cfg.volumes == nil {
		return z.release(ctx, owner, version)
	}
	errs := []error{z.release(ctx, owner, "")}
	vs, err := z.cfg.volumes.List(ctx)
	errs = append(errs, err)
	for _, v := range vs {
		if slices.Contains(v.Users, owner) {
			errs = append(errs, z.cfg.volumes.Release(ctx, v.Version, owner))
		}
	}
	return errors.Join(errs...)
}

// Allocator returns the allocator the containerizer draws on.
func (z *Containerizer) Allocator() *allocator.Allocator { return z.alloc }

// ReconcilesAllocator tells whether Recover reconciles the allocator on its
// own (WithReconcileAllocator).
func (z *Containerizer) ReconcilesAllocator() bool { return z.cfg.reconcile }

// Backend builds, for containerizer.Compose, a Docker containerizer on the
// daemon cli talks to, over the composite's allocator and its node
// (Allocator.Inventory). WithReconcileAllocator is refused (the composite
// reconciles) with an error matching containerizer.ErrAllocatorMismatch.
func Backend(cli Client, opts ...Option) containerizer.Backend {
	return func(alloc *allocator.Allocator) (containerizer.Kind, containerizer.Containerizer, error) {
		if alloc == nil {
			return containerizer.KindDocker, nil, fmt.Errorf("docker containerizer: nil allocator: %w", containerizer.ErrAllocatorMismatch)
		}
		z, err := New(cli, alloc, alloc.Inventory(), opts...)
		if err != nil {
			return containerizer.KindDocker, nil, err
		}
		if z.cfg.reconcile {
			return containerizer.KindDocker, nil, fmt.Errorf("docker containerizer: WithReconcileAllocator in a composite: %w", containerizer.ErrAllocatorMismatch)
		}
		return containerizer.KindDocker, z, nil
	}
}
