package containerizer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/node"
)

// Composite puts a native and a Docker containerizer behind one
// Containerizer: a spec with an Image goes to Docker, one without to the
// native back end. Both back ends draw on one *allocator.Allocator, so that
// they never hand out the same GPU, and neither reconciles it on its own
// (the native Config.ReconcileAllocator and docker.WithReconcileAllocator
// left out), so that neither's recovery releases the other's GPUs. Compose
// builds the back ends from the one allocator, so they cannot be given
// another; NewComposite checks back ends built apart (those that tell
// their allocator, as native's and Docker's do) and refuses a mix with
// ErrAllocatorMismatch.
//
// Container ids are unique across both back ends. Recover recovers both and
// then reconciles the allocator against the union of their live containers.
// Composite is safe for concurrent use.
type Composite struct {
	alloc    *allocator.Allocator
	backends map[Kind]Containerizer

	// routes are the containers by id, with their back end: the table of
	// launches in progress too.
	routes Table[Kind]
}

var _ Containerizer = (*Composite)(nil)

// ErrAllocatorMismatch: a Composite's back ends do not share its one
// allocator, or one reconciles it on its own.
var ErrAllocatorMismatch = node.Sentinel(node.ErrInvalid, "back end not over the composite's allocator")

// Backend builds a back end of a Composite over its allocator (see
// Compose): native.Backend and docker.Backend are the two.
type Backend func(alloc *allocator.Allocator) (Kind, Containerizer, error)

// allocated is a back end that tells the allocator it draws on and whether
// it reconciles it on its own.
type allocated interface {
	Allocator() *allocator.Allocator
	ReconcilesAllocator() bool
}

// Compose returns a Composite over alloc whose back ends the builders make
// from it (at most one per Kind): the allocator is given once, to all.
func Compose(alloc *allocator.Allocator, backends ...Backend) (*Composite, error) {
	if alloc == nil {
		return nil, fmt.Errorf("composite containerizer: nil allocator: %w", node.ErrInvalid)
	}
	made := map[Kind]Containerizer{}
	for _, b := range backends {
		if b == nil {
			return nil, fmt.Errorf("composite containerizer: nil back end: %w", node.ErrInvalid)
		}
		kind, z, err := b(alloc)
		if err != nil {
			return nil, fmt.Errorf("composite containerizer: %s: %w", kind, err)
		}
		if _, dup := made[kind]; dup {
			return nil, fmt.Errorf("composite containerizer: two %s back ends: %w", kind, node.ErrInvalid)
		}
		made[kind] = z
	}
	return NewComposite(alloc, made[KindNative], made[KindDocker])
}

// NewComposite returns a Composite over native and docker, which must draw
// on alloc and not reconcile it on their own (ErrAllocatorMismatch). Either
// back end may be nil: specs routed to it are refused with ErrNotSupported.
func NewComposite(alloc *allocator.Allocator, native, docker Containerizer) (*Composite, error) {
	if alloc == nil {
		return nil, fmt.Errorf("composite containerizer: nil allocator: %w", node.ErrInvalid)
	}
	if native == nil && docker == nil {
		return nil, fmt.Errorf("composite containerizer: no back end: %w", node.ErrInvalid)
	}
	c := &Composite{alloc: alloc, backends: map[Kind]Containerizer{}}
	for kind, b := range map[Kind]Containerizer{KindNative: native, KindDocker: docker} {
		if b == nil {
			continue
		}
		if a, ok := b.(allocated); ok {
			switch {
			case a.Allocator() != alloc:
				return nil, fmt.Errorf("composite containerizer: the %s back end draws on another allocator: %w", kind, ErrAllocatorMismatch)
			case a.ReconcilesAllocator():
				return nil, fmt.Errorf("composite containerizer: the %s back end reconciles the allocator on its own: %w", kind, ErrAllocatorMismatch)
			}
		}
		c.backends[kind] = b
	}
	return c, nil
}

// Route returns the back end a spec goes to: Docker when it names an image.
func Route(spec Spec) Kind {
	if spec.Image != "" {
		return KindDocker
	}
	return KindNative
}

// Launch launches spec on its back end. An id already used by either back
// end is refused with ErrContainerExists.
func (c *Composite) Launch(ctx context.Context, spec Spec) (Container, error) {
	if c.alloc == nil {
		return Container{}, fmt.Errorf("launch %s: %w", spec.ID, ErrNotMade)
	}
	kind := Route(spec)
	b, ok := c.backends[kind]
	if !ok {
		return Container{}, fmt.Errorf("launch %s: no %s containerizer: %w", spec.ID, kind, ErrNotSupported)
	}
	if err := c.routes.Begin(spec.ID, kind); err != nil {
		return Container{}, fmt.Errorf("launch: %w", err)
	}
	ctr, err := b.Launch(ctx, spec)
	if serr := c.routes.Settle(spec.ID, err == nil); serr != nil && err == nil {
		err = serr
	}
	return ctr, err
}

// backend returns the back end of a launched container.
func (c *Composite) backend(id string) (Containerizer, error) {
	kind, st, err := c.routes.Get(id)
	if err != nil {
		return nil, err
	}
	if st == StateLaunching {
		return nil, fmt.Errorf("%s: %w", id, ErrUnknownContainer)
	}
	return c.backends[kind], nil
}

// Wait waits for the container on its back end.
func (c *Composite) Wait(ctx context.Context, id string) (ExitStatus, error) {
	b, err := c.backend(id)
	if err != nil {
		return ExitStatus{}, fmt.Errorf("wait: %w", err)
	}
	return b.Wait(ctx, id)
}

// Update asks the container's back end to change its GPUs (Docker cannot:
// ErrNotSupported).
func (c *Composite) Update(ctx context.Context, id string, gpus int) (Container, error) {
	b, err := c.backend(id)
	if err != nil {
		return Container{}, fmt.Errorf("update: %w", err)
	}
	return b.Update(ctx, id, gpus)
}

// Destroy destroys the container on its back end, waiting first for a
// launch of it in progress to end (see Table); an unknown one is not an
// error. A Destroy of a container that another Destroy is at is refused
// with a *TransitionError.
func (c *Composite) Destroy(ctx context.Context, id string) error {
	kind, _, ok, err := c.routes.Destroying(ctx, id)
	if err != nil {
		return fmt.Errorf("destroy: %w", err)
	}
	if !ok {
		return nil
	}
	if err := c.backends[kind].Destroy(ctx, id); err != nil {
		return errors.Join(err, c.routes.Restore(id, false))
	}
	return c.routes.Remove(id)
}

// Recover recovers both back ends (a failure of one does not stop the
// other) and returns every container they know afterwards; when both
// succeeded it reconciles the allocator against the union of their
// containers, so that GPUs held for containers neither knows are released.
// A back end that is a Lifecycle also keeps the GPUs of the containers its
// runtime lists for other live supervisors, and of launches in progress.
// A container that runs with GPUs the allocator does not hold for it (a back
// end that reconciled on its own released them) is reported in the error.
func (c *Composite) Recover(ctx context.Context) ([]Container, error) {
	if c.alloc == nil {
		return nil, fmt.Errorf("recover: %w", ErrNotMade)
	}
	var all []Container
	var errs []error
	ok := true
	routes := map[string]Kind{}
	held := map[string]bool{} // owners the back ends' recoveries say hold GPUs beside their containers
	for _, kind := range []Kind{KindNative, KindDocker} {
		b, has := c.backends[kind]
		if !has {
			continue
		}
		var err error
		if hr, isHR := b.(holdingRecoverer); isHR {
			var holding []string
			_, holding, err = hr.recoverHolding(ctx)
			for _, id := range holding {
				held[id] = true
			}
		} else {
			_, err = b.Recover(ctx)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("recover %s: %w", kind, err))
			ok = false
		}
		// Every container the back end knows now, re-adopted or known
		// before.
		for _, ctr := range b.Containers() {
			if other, dup := routes[ctr.ID]; dup {
				errs = append(errs, fmt.Errorf("recover: container %s is both %s and %s: %w", ctr.ID, other, kind, ErrContainerExists))
				ok = false
				continue
			}
			routes[ctr.ID] = kind
			all = append(all, ctr)
		}
	}
	// The table now: launches in flight keep their reservation, and a
	// container being destroyed stays with its Destroy.
	for _, e := range c.routes.List(false) {
		if _, found := routes[e.ID]; !found && e.State != StateDestroying {
			c.routes.Delete(e.ID)
		}
	}
	for _, ctr := range all {
		if _, _, err := c.routes.Get(ctr.ID); err != nil {
			if ctr.State != StateRunning && ctr.State != StateExited {
				continue // a back end's own Destroy is at it
			}
			errs = append(errs, c.routes.Adopt(ctr.ID, ctr.State, routes[ctr.ID]))
		} else {
			errs = append(errs, c.routes.Set(ctr.ID, routes[ctr.ID]))
		}
	}
	if ok {
		live := make([]string, 0, len(routes)+len(held))
		for id := range routes {
			live = append(live, id)
		}
		for id := range held {
			live = append(live, id)
		}
		for _, e := range c.routes.List(true) {
			if e.State == StateLaunching {
				live = append(live, e.ID) // a launch in flight holds its GPUs
			}
		}
		res, err := c.alloc.Reconcile(ctx, live)
		if err != nil {
			errs = append(errs, fmt.Errorf("recover: %w", err))
		}
		// The daemons of the shares the reconciliation released.
		for _, kind := range []Kind{KindNative, KindDocker} {
			if s, ok := c.backends[kind].(daemonSweeper); ok {
				errs = append(errs, s.sweepDaemons(ctx))
			}
		}
		for _, owner := range res.Unknown {
			for _, ctr := range all {
				if ctr.ID == owner && len(ctr.GPUs) > 0 {
					errs = append(errs, fmt.Errorf("recover: container %s runs with GPUs the allocator does not hold for it", owner))
				}
			}
		}
	}
	slices.SortFunc(all, func(a, b Container) int { return strings.Compare(a.ID, b.ID) })
	return all, errors.Join(errs...)
}

// daemonSweeper is a back end that stops the MPS daemons of released
// shares (a Lifecycle).
type daemonSweeper interface {
	sweepDaemons(ctx context.Context) error
}

// Containers lists the containers of both back ends, by id (copies).
func (c *Composite) Containers() []Container {
	var all []Container
	for _, kind := range []Kind{KindNative, KindDocker} {
		if b, ok := c.backends[kind]; ok {
			all = append(all, b.Containers()...)
		}
	}
	slices.SortFunc(all, func(a, b Container) int { return strings.Compare(a.ID, b.ID) })
	return all
}
