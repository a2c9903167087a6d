package main

// Ownership that follows the container.
//
// With a state directory, every container gpuiso-runtime prepares has a
// record, DIR/gpuiso-runtime/OWNER.json, written (synced) before anything is
// claimed for it and removed once its claims are given back. OWNER names the
// container in one runc root: its id, a dot and 12 hex digits of the root's
// SHA-256 (ownerOf); it is the container's owner in the allocator and its
// user of the driver volume, so that two roots may hold containers of one
// id, and a delete in one root never touches the other's.
//
// A record is "creating" from before the claim until runc has reported the
// container: the allocator then holds the GPUs with no holder (so that no
// ReleaseDead, of any program sharing the directory, frees them), and the
// record's lock file, OWNER.lock, is held by gpuiso-runtime and by the
// runc it runs, which inherits it: runc create until it returns, runc run
// (in the foreground) for the container's life. Once runc has created the
// container, the claim's holder becomes the container's init (pid and
// start time, from "runc state") and the record "created". A record whose
// lock nobody holds is settled by asking runc, in the record's root, for
// the container's state: a container that exists with a live init keeps
// its GPUs, held by that init; one that does not exist, or whose init is
// dead, gives back its GPUs and its use of the driver volume, and its
// record goes. Every create and delete on the state directory settles the
// records nobody holds, so that a runtime killed at any point leaves the
// claim with the container, never with a dead process.
//
// A delete that names no state directory (Podman's cleanup runs the
// runtime without its flags) finds the container's in the index,
// /run/gpuiso-runtime/OWNER.json, written beside the record.
//
// A memory share's MPS control daemon (package isolator/mps, under the
// state directory's mps/) is part of the claim: started in the prepare
// step, after the record and the allocation, and stopped wherever the claim
// is given back (a failed runc, a delete, a settled record whose container
// is gone), before the allocation. Settling a record whose container lives
// starts its dead daemon again in place; every create and delete also
// stops the daemons that neither a record nor a memory share in the
// allocator explains.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/isolator/mps"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/volume"
)

// Errors of the container records.
var (
	// ErrCorruptRecord: a container's record does not read back as written.
	ErrCorruptRecord = node.Sentinel(node.ErrCorrupt, "corrupt container record")
	// ErrContainerBusy: another process is creating, running or deleting
	// a container of that id in that root.
	ErrContainerBusy = node.Sentinel(node.ErrUnavailable, "container is being created, run or deleted by another process")
	// ErrContainerExists: a container of that id in that root holds a
	// claim already.
	ErrContainerExists = node.Sentinel(node.ErrExists, "container exists")
)

const (
	// recordsDir is the directory of the records inside the state
	// directory.
	recordsDir = "gpuiso-runtime"
	// daemonsDir is the directory of the memory shares' MPS daemons inside
	// the state directory (gpurun's too, so gpuinfo lists them).
	daemonsDir = "mps"
	// defaultIndexDir maps owners to their state directories for a delete
	// run without flags.
	defaultIndexDir = "/run/gpuiso-runtime"
	// defaultRuncRoot is runc's root when --root is not given (runc run as
	// root).
	defaultRuncRoot = "/run/runc"

	// deleteLockWait bounds how long a delete waits for a record another
	// process holds (a foreground run's runc, which the delete ends).
	deleteLockWait = 5 * time.Second
	// claimLockWait bounds how long a create waits for its record's lock,
	// which another process's recovery may hold for a moment.
	claimLockWait = 2 * time.Second
	// settleTimeout bounds the settling after runc returns, which a SIGTERM
	// to gpuiso-runtime does not cut short.
	settleTimeout = 30 * time.Second
	// stateTimeout bounds one "runc state".
	stateTimeout = 10 * time.Second
)

// ownerOf is the owner of container id in runc root (a resolved path): the
// id, a dot and 12 hex digits of the root's SHA-256.
func ownerOf(id, root string) (string, error) {
	sum := sha256.Sum256([]byte(root))
	owner, err := node.ParseOwner(id + "." + hex.EncodeToString(sum[:6]))
	if err != nil {
		return "", fmt.Errorf("container id %q: %w", id, err)
	}
	return owner.String(), nil
}

// runcRoot is the runc root s names (--root), else runc's default, as
// resolvePath gives it.
func (s Settings) runcRoot() string {
	root := defaultRuncRoot
	for i := 0; i < len(s.RuncArgs); i++ {
		name, value, hasValue := strings.Cut(strings.TrimLeft(s.RuncArgs[i], "-"), "=")
		if !slices.Contains(runcValueFlags, name) || hasValue {
			if name == "root" && hasValue {
				root = value
			}
			continue
		}
		if i+1 < len(s.RuncArgs) {
			i++
			if name == "root" {
				root = s.RuncArgs[i]
			}
		}
	}
	return resolvePath(root)
}

// resolvePath makes p absolute and resolves the symlinks of its longest
// existing part, so that every spelling of one directory (/var/run/x and
// /run/x), made yet or not, gives one path.
func resolvePath(p string) string {
	abs, err := filepath.Abs(p)
	if err != nil {
		return filepath.Clean(p)
	}
	rest := ""
	for dir := abs; ; {
		if r, err := filepath.EvalSymlinks(dir); err == nil {
			return filepath.Join(r, rest)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return abs
		}
		rest = filepath.Join(filepath.Base(dir), rest)
		dir = parent
	}
}

// claim is the container this process is creating: its record, whose lock
// it holds, and the allocator the claim is in.
type claim struct {
	rs    records
	rec   ctrRecord
	lock  *os.File
	alloc *allocator.Allocator
}

// beginClaim settles the state directory's records, then takes the record
// of container c (owner) for this process and writes it "creating", before
// anything is claimed: from then on, the claim is the record's. It refuses a
// container of that id and root that another process is creating, or that
// holds a claim already.
func (rt *Runtime) beginClaim(ctx context.Context, alloc *allocator.Allocator, c CreateArgs, owner, bundle string) error {
	rs, err := rt.recordsOf(rt.StateDir)
	if err != nil {
		return err
	}
	runc, err := lookRunc(rt.Runc)
	if err != nil {
		return err
	}
	if runc, err = filepath.Abs(runc); err != nil {
		return err
	}
	rt.recover(ctx, alloc, rs)
	lock, err := rs.lock(ctx, owner, claimLockWait)
	if err != nil {
		return fmt.Errorf("container %s in %s: %w", c.ID, rt.runcRoot(), err)
	}
	if _, err := os.Stat(rs.path(owner)); err == nil || !errors.Is(err, fs.ErrNotExist) {
		lock.Close()
		return fmt.Errorf("container %s in %s: %w", c.ID, rt.runcRoot(), ErrContainerExists)
	}
	rec := ctrRecord{
		Owner: owner, ID: c.ID, Root: rt.runcRoot(), Runc: runc, Bundle: resolvePath(bundle),
		Simulate: rt.Simulate, Phase: phaseCreating,
	}
	if rt.DevRoot != "" {
		rec.DevRoot = resolvePath(rt.DevRoot)
	}
	err = rs.writeIndex(owner)
	if err == nil {
		err = rs.write(rec)
	}
	if err != nil {
		rs.remove(owner, lock)
		return err
	}
	rt.claim = &claim{rs: rs, rec: rec, lock: lock, alloc: alloc}
	return nil
}

// settleCreate decides, once runc's create or run of container c returned
// code, who holds the claim of res: the container's init when runc reports
// it alive (after a failed runc, only a container from this bundle: another
// of that id is not this one), else nobody, and everything is given back.
// A claim whose container runc cannot be asked about stays the record's,
// for the next create or delete to settle. Without a claim (no state
// directory) only the use of the driver volume is given back, the same
// way.
func (rt *Runtime) settleCreate(ctx context.Context, res *prepared, c CreateArgs, code int) {
	cl := rt.claim
	var rec ctrRecord
	var bundle string
	if cl != nil {
		rec, bundle = cl.rec, cl.rec.Bundle
	} else {
		runc, err := lookRunc(rt.Runc)
		if err == nil {
			runc, err = filepath.Abs(runc)
		}
		if err != nil {
			rt.Log.Error("ask runc for the container", "container", c.ID, "err", err)
			return
		}
		rec, bundle = ctrRecord{ID: c.ID, Root: rt.runcRoot(), Runc: runc}, resolvePath(c.Bundle)
	}
	if code == 0 {
		bundle = ""
	}
	init, err := rec.liveInit(ctx, bundle)
	if cl == nil {
		if err != nil {
			rt.Log.Error("ask runc for the container: its use of the driver volume stays", "container", c.ID, "err", err)
		} else if init == nil {
			if err := res.undo(ctx); err != nil {
				rt.Log.Error("give back", "container", c.ID, "err", err)
			}
		}
		return
	}
	if err != nil {
		rt.Log.Error("ask runc for the container: its claim stays recorded", "container", cl.rec.ID, "err", err)
		rt.claim = nil
		cl.lock.Close()
		return
	}
	if init == nil {
		rt.giveBack(ctx, res)
		return
	}
	if err := rt.hold(ctx, cl.alloc, cl.rs, cl.rec, init); err != nil {
		rt.Log.Error("hand the claim to the container's init: it stays recorded", "container", cl.rec.ID, "err", err)
	} else {
		rt.Log.Info("claim held by the container's init", "container", cl.rec.ID, "owner", cl.rec.Owner, "pid", init.Pid)
	}
	rt.claim = nil
	cl.lock.Close()
}

// giveBack gives back what this process claimed (res, when Prepare
// returned it, else whatever the allocator and the driver volume hold for
// the owner) and removes the record.
func (rt *Runtime) giveBack(ctx context.Context, res *prepared) {
	cl := rt.claim
	if cl == nil {
		if res != nil {
			if err := res.undo(ctx); err != nil {
				rt.Log.Error("give back", "err", err)
			}
		}
		return
	}
	rt.claim = nil
	var errs []error
	if res != nil {
		errs = append(errs, res.undo(ctx))
	}
	daemons, err := rt.daemonsOf(cl.rs.stateDir(), false)
	errs = append(errs, err)
	errs = append(errs, releaseOwner(ctx, cl.alloc, daemons, cl.rec.Owner))
	errs = append(errs, cl.rs.remove(cl.rec.Owner, cl.lock))
	if err := errors.Join(errs...); err != nil {
		rt.Log.Error("give back", "container", cl.rec.ID, "err", err)
	}
}

// abandon gives back a claim that Prepare began and Create never settled
// (Prepare failed), whatever the state of ctx.
func (rt *Runtime) abandon(ctx context.Context) {
	if rt.claim == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	rt.giveBack(ctx, nil)
}

// hold makes init the holder of rec's claim and the record "created".
func (rt *Runtime) hold(ctx context.Context, alloc *allocator.Allocator, rs records, rec ctrRecord, init *allocator.Holder) error {
	if err := alloc.SetHolder(ctx, rec.Owner, init); err != nil && !errors.Is(err, allocator.ErrUnknownOwner) {
		return err
	}
	rec.Phase, rec.Init = phaseCreated, init
	return rs.write(rec)
}

// releaseOwner gives back owner's GPUs in alloc (nil: none), after
// stopping the MPS daemon of its share in daemons (nil: none), and its use
// of the driver volume.
func releaseOwner(ctx context.Context, alloc *allocator.Allocator, daemons *mps.Manager, owner string) error {
	var errs []error
	if daemons != nil {
		errs = append(errs, daemons.Stop(ctx, owner))
	}
	if alloc != nil {
		// Only this owner's own create claims under its name, so an owner
		// the state does not list (read without the lock) holds nothing, and
		// a create refused at the lock does not wait for it again here.
		_, err := alloc.Allocation(owner)
		if err == nil {
			err = alloc.Release(ctx, owner)
		}
		if err != nil && !errors.Is(err, allocator.ErrUnknownOwner) {
			errs = append(errs, err)
		}
	}
	errs = append(errs, releaseVolumeUse(ctx, owner))
	return errors.Join(errs...)
}

// releaseVolumeUse forgets owner as a user of every driver volume.
func releaseVolumeUse(ctx context.Context, owner string) error {
	vols, err := volume.New()
	if err != nil {
		return err
	}
	list, err := vols.List(ctx)
	var errs []error
	errs = append(errs, err)
	for _, v := range list {
		if slices.Contains(v.Users, owner) {
			errs = append(errs, vols.Release(ctx, v.Version, owner))
		}
	}
	return errors.Join(errs...)
}

// usesVolume reports whether owner uses a driver volume.
func usesVolume(ctx context.Context, owner string) bool {
	vols, err := volume.New()
	if err != nil {
		return false
	}
	list, _ := vols.List(ctx)
	for _, v := range list {
		if slices.Contains(v.Users, owner) {
			return true
		}
	}
	return false
}

// settle decides rec's fate for a caller that holds its lock, which it
// closes: a creating record's container, asked of runc, keeps its claim
// (held by its init) if it lives, else gives everything back; a created
// record's does when its init is dead. It returns whether the claim was
// given back.
func (rt *Runtime) settle(ctx context.Context, alloc *allocator.Allocator, rs records, rec ctrRecord, lock *os.File) (bool, error) {
	daemons, err := rt.daemonsOf(rs.stateDir(), false)
	if err != nil {
		lock.Close()
		return false, err
	}
	var init *allocator.Holder
	switch {
	case rec.Phase == phaseCreated && rec.Init != nil && !allocator.HolderDead("", *rec.Init):
		err := rt.keepDaemon(ctx, alloc, daemons, rec)
		lock.Close()
		return false, err
	case rec.Phase == phaseCreating:
		var err error
		if init, err = rec.liveInit(ctx, ""); err != nil {
			lock.Close()
			return false, err
		}
	}
	if init != nil {
		err := rt.hold(ctx, alloc, rs, rec, init)
		if err == nil {
			rt.Log.Info("claim of a container created by a process that ended: held by its init", "container", rec.ID, "root", rec.Root, "pid", init.Pid)
			err = rt.keepDaemon(ctx, alloc, daemons, rec)
		}
		lock.Close()
		return false, err
	}
	err = errors.Join(releaseOwner(ctx, alloc, daemons, rec.Owner), rs.remove(rec.Owner, lock))
	if err == nil {
		rt.Log.Info("gave back the claim of a container that is gone", "container", rec.ID, "root", rec.Root)
	}
	return err == nil, err
}

// recover settles every record of rs that no process holds: the claims of
// containers whose creator was killed, and of containers that died.
func (rt *Runtime) recover(ctx context.Context, alloc *allocator.Allocator, rs records) {
	owners, err := rs.owners()
	if err != nil {
		rt.Log.Error("list container records", "dir", rs.dir, "err", err)
		return
	}
	for _, owner := range owners {
		if rt.claim != nil && owner == rt.claim.rec.Owner {
			continue
		}
		lock, err := rs.lock(ctx, owner, 0)
		if err != nil {
			continue // being created, run or deleted: its process settles it
		}
		rec, err := rs.read(owner)
		if errors.Is(err, fs.ErrNotExist) {
			lock.Close() // settled meanwhile
			continue
		}
		if err != nil {
			lock.Close()
			rt.Log.Error("container record", "err", err)
			continue
		}
		if _, err := rt.settle(ctx, alloc, rs, rec, lock); err != nil {
			rt.Log.Error("settle the claim of a container", "container", rec.ID, "root", rec.Root, "err", err)
		}
	}
	rt.sweepDaemons(ctx, alloc, rs)
}

// daemonsOf returns the manager of the MPS daemons of state directory
// stateDir, opened once per process; without create, nil when the
// directory has none (no share was ever made there), and nil on a node
// without the MPS control daemon, which then has no daemon to stop.
func (rt *Runtime) daemonsOf(stateDir string, create bool) (*mps.Manager, error) {
	abs, err := filepath.Abs(stateDir)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(abs, daemonsDir)
	if m, ok := rt.daemons[dir]; ok {
		return m, nil
	}
	if _, err := os.Stat(dir); err != nil && !create {
		return nil, nil
	}
	m, err := mps.New(dir, mps.WithLogger(rt.Log))
	if errors.Is(err, mps.ErrNoControl) && !create {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if rt.daemons == nil {
		rt.daemons = map[string]*mps.Manager{}
	}
	rt.daemons[dir] = m
	return m, nil
}

// closeDaemons lets go of the daemons' directories (the daemons run on).
func (rt *Runtime) closeDaemons() {
	for _, m := range rt.daemons {
		m.Close()
	}
	rt.daemons = nil
}

// keepDaemon starts again, in place, the MPS daemon of the memory share
// (or of the concurrent slice's GPU) of rec's container, which lives: one
// that was killed, or whose start a killed gpuiso-runtime cut short. A
// running daemon is left as it is.
func (rt *Runtime) keepDaemon(ctx context.Context, alloc *allocator.Allocator, daemons *mps.Manager, rec ctrRecord) error {
	if daemons == nil || alloc == nil {
		return nil
	}
	al, err := alloc.Allocation(rec.Owner)
	if err != nil || al.Share == nil || (al.Share.Mode != allocator.ShareMemory && al.Share.Mode != allocator.ShareSlice) || len(al.Devices) != 1 {
		return nil
	}
	before := time.Now()
	d, err := daemons.StartShare(ctx, al)
	if err != nil {
		return err
	}
	if !d.Started.Before(before) {
		rt.Log.Info("mps daemon of a living container started again", "container", rec.ID, "root", rec.Root, "pid", d.Pid)
	}
	return nil
}

// sweepDaemons stops the MPS daemons of rs's state directory that no
// record explains and whose owner holds no memory share in alloc: left by
// a process killed between giving back a claim and removing its record, or
// by another program sharing the directory that released its share.
func (rt *Runtime) sweepDaemons(ctx context.Context, alloc *allocator.Allocator, rs records) {
	daemons, err := rt.daemonsOf(rs.stateDir(), false)
	if daemons == nil || err != nil {
		if err != nil {
			rt.Log.Error("mps daemons", "dir", rs.stateDir(), "err", err)
		}
		return
	}
	keep := mps.Keep{Shares: alloc, Recorded: func(owner string) bool {
		_, err := os.Stat(rs.path(owner))
		return err == nil || !errors.Is(err, fs.ErrNotExist)
	}}
	stopped, err := daemons.Sweep(ctx, keep.Keeps)
	if err != nil {
		rt.Log.Error("stop the mps daemons no container explains", "err", err)
	}
	if len(stopped) > 0 {
		rt.Log.Info("stopped the mps daemons no container explains", "owners", stopped)
	}
}

// openAllocator opens the allocator of state directory dir on the node
// named by simulate and devRoot.
func (rt *Runtime) openAllocator(ctx context.Context, dir, simulate, devRoot string) (*allocator.Allocator, error) {
	s := rt.Settings
	s.Simulate, s.DevRoot = simulate, devRoot
	inv, _, err := openNode(ctx, s)
	if err != nil {
		return nil, err
	}
	return allocator.New(inv, allocator.WithStateDir(dir))
}
