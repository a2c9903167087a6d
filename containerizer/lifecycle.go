package containerizer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/isolator/mps"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/volume"
)

// LifecycleConfig is what a Lifecycle works with. Allocator and a
// runtime (Runtime or Runtimes) are required; zero values of the rest mean
// their defaults.
type LifecycleConfig struct {
	// Runtime runs the containers: the one runtime of a Lifecycle over one.
	// Every spec goes to it (its Image refuses what it cannot run).
	Runtime Runtime
	// Runtimes run the containers of a Lifecycle over several, at most one
	// per Kind (Runtime, when set too, counts as one more): each spec goes to
	// the runtime of its kind (Route: Docker when it names an image,
	// native otherwise), and a spec of a kind none runs is refused with
	// ErrNotSupported. Container ids are unique across them.
	Runtimes []Runtime
	// Allocator hands out the GPUs, taken once: every runtime's containers
	// draw on it (so no GPU is handed out twice), the Lifecycle builds its
	// prepare step on it, and Recover reconciles it. See Recover for what
	// the Lifecycle assumes of its other users.
	Allocator *allocator.Allocator
	// Volumes provides the driver volume; nil means containers get none.
	Volumes *volume.Manager
	// MPS starts, stops and recovers the MPS control daemons of memory
	// shares (package isolator/mps); nil means memory shares are refused
	// (ErrNoMPS).
	MPS *mps.Manager
	// SysRoot is the host's sysfs, for the CPUs local to a spec's GPUs
	// (Spec.CPUAffinity; default /sys).
	SysRoot string
	// Supervisor, when set, is the process that runs the containers and
	// whose death ends them: runtimes record it, and the GPUs are held with
	// it as holder (unless a spec's request names another). See Clean. A
	// runtime that names the supervisor of its containers itself
	// (Supervised) keeps its own, which must then agree with this one.
	Supervisor *allocator.Holder
	// Logger receives what the Lifecycle does (default: nothing).
	Logger *slog.Logger
	// ProcRoot is the proc file system in which the Lifecycle tells the
	// supervisors and holders of containers dead or alive. Empty means that
	// of a runtime that names one (native's Config.ProcRoot), else /proc;
	// runtimes that name different ones are refused.
	ProcRoot string
}

// procRooted is a Runtime that tells dead from live processes in a proc
// file system of its own (the native runtime's Config.ProcRoot).
type procRooted interface {
	ProcRoot() string
}

// Lifecycle is the one implementation of a container's life over one or
// several Runtimes: its states and the launches in progress (one Table
// across the runtimes), the prepare step, the one allocator and the
// recovery. It implements Containerizer and is safe for concurrent use.
type Lifecycle struct {
	cfg  LifecycleConfig
	rts  []*routed // in the order given; one per kind
	prep *Preparer
	log  *slog.Logger
	// proc is the proc file system of liveness checks.
	proc string

	table Table[*lifeEntry]
	mu    sync.Mutex // guards the entries' fields
}

var _ Containerizer = (*Lifecycle)(nil)

// routed is one runtime of a Lifecycle, with the supervisor of its
// containers.
type routed struct {
	Runtime
	sup *allocator.Holder
}

// lifeEntry is what the Lifecycle knows of one container: its runtime and
// its record, the one shape of a container between the runtimes and the
// Lifecycle (rec.Exit says how its command ended, once known).
type lifeEntry struct {
	rt  *routed
	rec Record
}

// NewLifecycle returns a Lifecycle over cfg's runtimes and cfg.Allocator.
// Two runtimes of one kind, or a runtime whose own supervisor (Supervised)
// is not cfg.Supervisor, are refused with an error matching node.ErrInvalid.
func NewLifecycle(cfg LifecycleConfig) (*Lifecycle, error) {
	var rts []Runtime
	if cfg.Runtime != nil {
		rts = append(rts, cfg.Runtime)
	}
	rts = append(rts, cfg.Runtimes...)
	if len(rts) == 0 || cfg.Allocator == nil {
		return nil, fmt.Errorf("lifecycle: a runtime and the Allocator are required: %w", node.ErrInvalid)
	}
	if cfg.Supervisor != nil {
		h := *cfg.Supervisor
		if h.Pid <= 0 || h.Start == 0 {
			return nil, fmt.Errorf("lifecycle: supervisor pid %d started at %d: %w", h.Pid, h.Start, node.ErrInvalid)
		}
		cfg.Supervisor = &h
	}
	l := &Lifecycle{cfg: cfg}
	for _, rt := range rts {
		if rt == nil {
			return nil, fmt.Errorf("lifecycle: nil runtime: %w", node.ErrInvalid)
		}
		if m, ok := rt.(Maker); ok && !m.Made() {
			return nil, fmt.Errorf("lifecycle: a runtime not made with its constructor: %w", ErrNotMade)
		}
		if slices.ContainsFunc(l.rts, func(o *routed) bool { return o.Kind() == rt.Kind() }) {
			return nil, fmt.Errorf("lifecycle: two %s runtimes: %w", rt.Kind(), node.ErrInvalid)
		}
		r := &routed{Runtime: rt, sup: cfg.Supervisor}
		if s, ok := rt.(Supervised); ok {
			own := s.Supervisor()
			if cfg.Supervisor != nil && (own == nil || *own != *cfg.Supervisor) {
				return nil, fmt.Errorf("lifecycle: the %s runtime has a supervisor of its own, not %v: %w", rt.Kind(), *cfg.Supervisor, node.ErrInvalid)
			}
			if own != nil {
				h := *own
				r.sup = &h
			}
		}
		if p, ok := rt.(procRooted); ok {
			switch own := p.ProcRoot(); {
			case own == "":
			case cfg.ProcRoot == "":
				cfg.ProcRoot = own
			case filepath.Clean(own) != filepath.Clean(cfg.ProcRoot):
				return nil, fmt.Errorf("lifecycle: the %s runtime's proc root %s is not %s: %w", rt.Kind(), own, cfg.ProcRoot, node.ErrInvalid)
			}
		}
		l.rts = append(l.rts, r)
	}
	l.cfg.ProcRoot, l.proc = cfg.ProcRoot, cfg.ProcRoot
	if l.proc == "" {
		l.proc = node.DefaultProcRoot
	}
	l.cfg.Runtime, l.cfg.Runtimes = nil, nil
	l.log = cfg.Logger
	if l.log == nil {
		l.log = slog.New(slog.DiscardHandler)
	}
	l.prep = &Preparer{Allocator: cfg.Allocator, Volumes: cfg.Volumes, MPS: cfg.MPS, SysRoot: cfg.SysRoot}
	return l, nil
}

func (l *Lifecycle) made() bool { return l != nil && l.prep != nil }

// Allocator returns the allocator the Lifecycle draws on.
func (l *Lifecycle) Allocator() *allocator.Allocator {
	if !l.made() {
		return nil
	}
	return l.cfg.Allocator
}

// Route returns the kind of runtime a spec goes to in a Lifecycle over
// several: Docker when it names an image, native otherwise.
func Route(spec Spec) Kind {
	if spec.Image != "" {
		return KindDocker
	}
	return KindNative
}

// route returns the runtime spec goes to: the one runtime, or that of its
// kind (Route).
func (l *Lifecycle) route(spec Spec) (*routed, error) {
	if len(l.rts) == 1 {
		return l.rts[0], nil
	}
	kind := Route(spec)
	for _, rt := range l.rts {
		if rt.Kind() == kind {
			return rt, nil
		}
	}
	return nil, fmt.Errorf("no %s runtime: %w", kind, ErrNotSupported)
}

// cleanupCtx is a context for undoing work after ctx may have ended.
func cleanupCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
}

// Launch checks spec.ID (node.ValidateOwner: the one check of the owner
// on the launch path; the runtimes and the prepare step trust it),
// reserves it (launching) across every runtime, asks spec's runtime (see
// Route) about the image, runs the prepare step, and has the runtime
// create and start the container (running). On error nothing is left: no
// container, no allocation, no volume use, and the id is free again.
func (l *Lifecycle) Launch(ctx context.Context, spec Spec) (c Container, err error) {
	if !l.made() {
		return c, fmt.Errorf("launch %s: %w", spec.ID, ErrNotMade)
	}
	if err := node.ValidateOwner(spec.ID); err != nil {
		return c, fmt.Errorf("launch %q: %w: %w", spec.ID, ErrInvalidSpec, err)
	}
	rt, err := l.route(spec)
	if err != nil {
		return c, fmt.Errorf("launch %s: %w", spec.ID, err)
	}
	e := &lifeEntry{rt: rt}
	if err := l.table.Begin(spec.ID, e); err != nil {
		return c, fmt.Errorf("launch: %w", err)
	}
	var p *Prepared
	var rec Record
	created, reserved := false, false
	defer func() {
		if err != nil {
			cctx, cancel := cleanupCtx(ctx)
			defer cancel()
			if created {
				rt.Remove(cctx, rec)
			}
			if p != nil {
				p.Undo(cctx)
			}
			if reserved {
				rt.Runtime.(Reserver).Unreserve(cctx, spec.ID)
			}
		}
		l.table.Settle(spec.ID, err == nil) // a Destroy waiting goes on
	}()
	img, err := rt.Image(ctx, spec)
	if err != nil {
		return c, fmt.Errorf("launch %s: %w", spec.ID, err)
	}
	if r, ok := rt.Runtime.(Reserver); ok {
		// Before anything is held: a kill from here on leaves a
		// reservation that the next recovery cleans up.
		if err = r.Reserve(ctx, spec); err != nil {
			return c, fmt.Errorf("launch %s: %w", spec.ID, err)
		}
		reserved = true
	}
	if rt.sup != nil && spec.GPUs.Holder == nil {
		h := *rt.sup
		spec.GPUs.Holder = &h
	}
	if p, err = l.prep.Prepare(ctx, spec, img); err != nil {
		return c, fmt.Errorf("launch %s: %w", spec.ID, err)
	}
	if rec, err = rt.Create(ctx, spec, p); err != nil {
		return c, fmt.Errorf("launch %s: %w", spec.ID, err)
	}
	created = true
	rec.ID, rec.GPUs, rec.Supervisor = spec.ID, slices.Clone(p.Allocation.Devices), rt.sup
	if s := p.Allocation.Share; s != nil {
		sh := *s
		rec.Share = &sh
	}
	if p.Volume != nil {
		rec.Volume, rec.VolumeVersion = p.Volume.Path, p.Volume.Version
	}
	if err = rt.Start(ctx, rec); err != nil {
		return c, fmt.Errorf("launch %s: %w", spec.ID, err)
	}
	l.mu.Lock()
	e.rec = rec
	l.mu.Unlock()
	l.log.InfoContext(ctx, "launched", "id", spec.ID, "kind", rt.Kind(), "runtime id", rec.RuntimeID, "gpus", len(rec.GPUs), "volume", rec.Volume)
	return describe(rt, rec, StateRunning), nil
}

func describe(rt *routed, rec Record, st State) Container {
	c := Container{ID: rec.ID, Kind: rt.Kind(), GPUs: slices.Clone(rec.GPUs), Volume: rec.Volume, Pid: rec.Pid, RuntimeID: rec.RuntimeID, State: st}
	if rec.Share != nil {
		s := *rec.Share
		c.Share = &s
	}
	return c
}

// lookup returns a launched container's entry and a copy of its record.
func (l *Lifecycle) lookup(id string) (*lifeEntry, Record, State, error) {
	e, st, err := l.table.Get(id)
	if err != nil || st == StateLaunching {
		return nil, Record{}, st, fmt.Errorf("%s: %w", id, ErrUnknownContainer)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return e, e.rec, st, nil
}

// Wait blocks until the container's command ends and returns how.
func (l *Lifecycle) Wait(ctx context.Context, id string) (ExitStatus, error) {
	if !l.made() {
		return ExitStatus{}, fmt.Errorf("wait %s: %w", id, ErrNotMade)
	}
	e, rec, _, err := l.lookup(id)
	if err != nil {
		return ExitStatus{}, fmt.Errorf("wait: %w", err)
	}
	l.mu.Lock()
	exit := e.rec.Exit
	l.mu.Unlock()
	if exit != nil {
		return *exit, nil
	}
	st, err := e.rt.Wait(ctx, rec)
	if err != nil {
		return st, fmt.Errorf("wait %s: %w", id, err)
	}
	l.mu.Lock()
	e.rec.Exit = &st
	l.mu.Unlock()
	_, _ = l.table.Exited(id, e) // refused for none: exited is after every state it can have
	return st, nil
}

// Update changes a running container's whole GPUs to gpus where its
// runtime can (Updater), in the order of Resize: the allocator is the
// record of what the container holds, and the container returned (on
// error too, when known) holds what the allocator holds for it afterwards.
// A process killed inside Update leaves a container the next Recover
// adopts with what the allocator holds, its devices enforced again (see
// Repairer).
//
// Its errors match, by node's kinds: ErrNotSupported (node.ErrNotSupported)
// for a runtime that cannot update (Docker) or a container that has
// exited; ErrUnknownContainer (node.ErrNotFound) for an id no running or
// exited container has; node.ErrInvalid for a count that cannot be asked
// (ErrInvalidSpec for none or fewer; allocator.ErrInvalidRequest for more
// than the node has, or a container holding a share or MIG devices) or a
// Lifecycle not made (ErrNotMade); node.ErrInsufficient
// (allocator.ErrInsufficient, allocator.ErrQuotaExceeded) when the GPUs to
// grow onto are not free now. A failure to enforce the devices comes as
// the runtime reports it; the container then keeps what it had.
func (l *Lifecycle) Update(ctx context.Context, id string, gpus int) (Container, error) {
	if !l.made() {
		return Container{}, fmt.Errorf("update %s: %w", id, ErrNotMade)
	}
	e, rec, st, err := l.lookup(id)
	if err != nil {
		return Container{}, fmt.Errorf("update: %w", err)
	}
	u, ok := e.rt.Runtime.(Updater)
	if !ok {
		return Container{}, fmt.Errorf("update %s to %d gpus: a %s container: %w", id, gpus, e.rt.Kind(), ErrNotSupported)
	}
	if st != StateRunning {
		return Container{}, fmt.Errorf("update %s: container has exited: %w", id, ErrNotSupported)
	}
	next, err := u.Update(ctx, l.cfg.Allocator, rec, gpus)
	// What it holds now is what the allocator says, whatever the step
	// that failed.
	if al, aerr := l.cfg.Allocator.Allocation(id); aerr == nil {
		next.GPUs = slices.Clone(al.Devices)
	} else if errors.Is(aerr, allocator.ErrUnknownOwner) {
		next.GPUs = nil
	}
	l.mu.Lock()
	next.Exit = e.rec.Exit // a Wait meanwhile keeps what it learnt
	e.rec = next
	l.mu.Unlock()
	if err != nil {
		return describe(e.rt, next, st), fmt.Errorf("update %s to %d gpus: %w", id, gpus, err)
	}
	return describe(e.rt, next, st), nil
}

// Destroy stops and removes the container and gives back its GPUs and its
// use of the volume. A launching container is waited for (see Table). An
// id the Lifecycle does not know whose runtime still lists a container (one
// Recover could not adopt, or a killed launch's reservation) that no other
// live process supervises has that removed, and what its owner holds given
// back; an id with nothing left is not an error, but an id no container
// can have is ErrInvalidSpec. On error the container is as it was, to be
// destroyed again.
func (l *Lifecycle) Destroy(ctx context.Context, id string) error {
	if !l.made() {
		return fmt.Errorf("destroy %s: %w", id, ErrNotMade)
	}
	if err := node.ValidateOwner(id); err != nil {
		// No container can have it: bad input, not a container gone.
		return fmt.Errorf("destroy %q: %w: %w", id, ErrInvalidSpec, err)
	}
	e, _, ok, err := l.table.Destroying(ctx, id)
	if err != nil {
		return fmt.Errorf("destroy: %w", err)
	}
	if !ok {
		return l.destroyLeft(ctx, id)
	}
	l.mu.Lock()
	rec, exited := e.rec, e.rec.Exit != nil
	l.mu.Unlock()
	if err := l.remove(ctx, e.rt, rec, !exited); err != nil {
		return errors.Join(fmt.Errorf("destroy %s: %w", id, err), l.table.Restore(id, exited))
	}
	l.log.InfoContext(ctx, "destroyed", "id", id, "runtime id", rec.RuntimeID)
	return l.table.Remove(id)
}

// destroyLeft removes what the runtimes still list of id, a container the
// Lifecycle does not know, with what its owner holds: a container Recover
// could not adopt, a reservation or an ended container no one is left
// for. The id is reserved meanwhile, so that no launch of it begins. A
// launch in progress or a container of another live supervisor is left to
// it.
func (l *Lifecycle) destroyLeft(ctx context.Context, id string) error {
	if err := l.table.Begin(id, &lifeEntry{}); err != nil {
		return fmt.Errorf("destroy: %w", err)
	}
	defer l.table.Settle(id, false)
	var errs []error
	for _, rt := range l.rts {
		recs, err := rt.List(ctx)
		if err != nil {
			errs = append(errs, fmt.Errorf("destroy %s: %s: %w", id, rt.Kind(), err))
			continue
		}
		for _, r := range recs {
			if r.ID != id || rt.supervision(r.Supervisor, l.proc) == supLive {
				continue
			}
			l.log.InfoContext(ctx, "removing a container not adopted", "id", id, "kind", rt.Kind(), "runtime id", r.RuntimeID, "reserved", r.Reserved)
			if err := l.unlaunch(ctx, rt, r); err != nil {
				errs = append(errs, fmt.Errorf("destroy %s: %w", id, err))
			}
		}
	}
	return errors.Join(errs...)
}

// remove is the Lifecycle's one teardown of a container a runtime has:
// Destroy's, Destroy's of a container not adopted, Recover's of one no one
// can use and Clean's of a dead supervisor's all go through it. It kills
// the container when kill, removes it, then gives back what its owner
// holds (release: the MPS daemon, the allocation, and the use of the volume
// version its record names, or of every version when it names none) and
// drops its reservation. A record of no owner is only removed. On error
// what is not given back yet stays held, for the next path to find. (A
// failed Launch undoes its own steps instead: see Launch.)
func (l *Lifecycle) remove(ctx context.Context, rt *routed, rec Record, kill bool) error {
	if kill {
		if err := rt.Kill(ctx, rec); err != nil {
			return err
		}
	}
	if err := rt.Remove(ctx, rec); err != nil {
		return err
	}
	if rec.ID == "" {
		return nil
	}
	if err := l.release(ctx, rec.ID, rec.VolumeVersion, rec.VolumeVersion == ""); err != nil {
		return err
	}
	return unreserve(ctx, rt, rec.ID)
}

// unreserve drops id's reservation where the runtime is a Reserver: the
// last step of a teardown, once what the container held is given back.
func unreserve(ctx context.Context, rt *routed, id string) error {
	if r, ok := rt.Runtime.(Reserver); ok {
		return r.Unreserve(ctx, id)
	}
	return nil
}

// release gives back owner's GPUs and its use of the volume version; with
// every, of every version it uses. A memory share's MPS daemon is stopped
// first: while it cannot be, the share stays held.
func (l *Lifecycle) release(ctx context.Context, owner, version string, every bool) error {
	if l.cfg.MPS != nil {
		if err := l.cfg.MPS.Stop(ctx, owner); err != nil {
			return err
		}
	}
	var errs []error
	if err := l.cfg.Allocator.Release(ctx, owner); err != nil && !errors.Is(err, allocator.ErrUnknownOwner) {
		errs = append(errs, err)
	}
	vols := l.cfg.Volumes
	switch {
	case vols == nil:
	case version != "":
		errs = append(errs, vols.Release(ctx, version, owner))
	case every:
		vs, err := vols.List(ctx)
		errs = append(errs, err)
		for _, v := range vs {
			if slices.Contains(v.Users, owner) {
				errs = append(errs, vols.Release(ctx, v.Version, owner))
			}
		}
	}
	return errors.Join(errs...)
}

// Containers lists the containers of every runtime, by id (launches in
// progress aside).
func (l *Lifecycle) Containers() []Container {
	if !l.made() {
		return nil
	}
	var out []Container
	for _, x := range l.table.List(false) {
		l.mu.Lock()
		rec := x.Value.rec
		l.mu.Unlock()
		out = append(out, describe(x.Value.rt, rec, x.State))
	}
	return out
}

// Usage reports what container id's processes use of its GPUs, where its
// runtime can tell (UsageReader: the native runtime with NVML); others
// refuse with an error matching ErrNotSupported.
func (l *Lifecycle) Usage(ctx context.Context, id string) (node.Usage, error) {
	if !l.made() {
		return node.Usage{}, fmt.Errorf("usage of %s: %w", id, ErrNotMade)
	}
	e, rec, _, err := l.lookup(id)
	if err != nil {
		return node.Usage{}, fmt.Errorf("usage: %w", err)
	}
	u, ok := e.rt.Runtime.(UsageReader)
	if !ok {
		return node.Usage{}, fmt.Errorf("usage of %s: a %s container: %w", id, e.rt.Kind(), ErrNotSupported)
	}
	return u.Usage(ctx, rec)
}

// TempDir makes a directory for this process's own use while it runs
// (such as the unpacked image a container of it runs in), where a runtime
// makes them (TempDirMaker: the native runtime, in its state directory;
// the first such runtime of the Lifecycle); a recovery removes it once the
// process has died. Without such a runtime it fails with an error matching
// ErrNotSupported.
func (l *Lifecycle) TempDir() (string, error) {
	if !l.made() {
		return "", fmt.Errorf("temporary directory: %w", ErrNotMade)
	}
	for _, rt := range l.rts {
		if m, ok := rt.Runtime.(TempDirMaker); ok {
			return m.TempDir()
		}
	}
	return "", fmt.Errorf("temporary directory: no runtime makes one: %w", ErrNotSupported)
}
