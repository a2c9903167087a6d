package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/internal/cli"
	"github.com/gpuiso/gpuiso/isolator/mps"
	"github.com/gpuiso/gpuiso/isolator/oci"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/volume"
)

// Runtime carries out the commands gpuiso-runtime does not simply hand to
// runc.
type Runtime struct {
	Settings
	Log *slog.Logger
	// IndexDir is where a delete that names no state directory finds a
	// container's ("" means /run/gpuiso-runtime).
	IndexDir string

	// claim is the container this process is creating, from Prepare until
	// runc reported it (claim.go).
	claim *claim
	// daemons are the MPS daemon managers of the state directories this
	// process opened, by directory (claim.go).
	daemons map[string]*mps.Manager
}

// prepared is a container whose spec gpuiso-runtime edited, with what it
// holds.
type prepared struct {
	owner string
	alloc *allocator.Allocator
	p     *containerizer.Prepared
}

// Prepare reads c's bundle, and for a container that asks for GPUs or the
// driver volume claims them (in the allocator, shared when a state
// directory is set) and writes the isolation into its config.json. A
// container asking for nothing gets nil and an untouched bundle. On error
// nothing is held and the bundle is as it was.
func (rt *Runtime) Prepare(ctx context.Context, c CreateArgs) (*prepared, error) {
	bundle, err := filepath.Abs(c.Bundle)
	if err != nil {
		return nil, err
	}
	configPath := filepath.Join(bundle, "config.json")
	raw, err := os.ReadFile(configPath)
	if err != nil {
		return nil, fmt.Errorf("container %s: %w", c.ID, err)
	}
	var spec specs.Spec
	if err := json.Unmarshal(raw, &spec); err != nil {
		return nil, fmt.Errorf("container %s: %s: %w", c.ID, configPath, err)
	}
	req, err := rt.request(ctx, &spec, bundle, c.ID)
	if err != nil {
		return nil, fmt.Errorf("container %s: %w", c.ID, err)
	}
	var env []string
	if spec.Process != nil {
		env = spec.Process.Env
	}
	// A container given GPUs (or a share of one) gets the driver to use
	// them with, wherever the request came from.
	wantsVolume := !req.None() || req.Volume || req.Share != nil
	if !wantsVolume {
		rt.Log.Debug("no GPU asked for: passed through", "container", c.ID)
		return nil, nil
	}
	if req.Share != nil && rt.StateDir == "" {
		return nil, fmt.Errorf("container %s asks for a share of %s (%s): %w", c.ID, req.Share, req.ShareSource, ErrShareNeedsState)
	}

	inv, _, err := openNode(ctx, rt.Settings)
	if err != nil {
		return nil, saysWhatToDo(fmt.Errorf("container %s: %w", c.ID, err))
	}
	opts := []allocator.Option{allocator.WithShared(rt.sharedGPUs(inv)...)}
	if rt.StateDir != "" {
		dir, err := filepath.Abs(rt.StateDir)
		if err != nil {
			return nil, err
		}
		opts = append(opts, allocator.WithStateDir(dir))
	}
	alloc, err := allocator.New(inv, opts...)
	if err != nil {
		return nil, fmt.Errorf("container %s: %w", c.ID, err)
	}
	pr := &containerizer.Preparer{Allocator: alloc}
	if req.Share != nil && (req.Share.Mode == allocator.ShareMemory || req.Share.Mode == allocator.ShareSlice) {
		// The share's MPS control daemon (or, for a concurrent slice, its
		// GPU's) is started in the prepare step, its directories under the
		// state directory's mps/.
		if pr.MPS, err = rt.daemonsOf(rt.StateDir, true); err != nil {
			return nil, fmt.Errorf("container %s asks for a share of %s (%s): %w", c.ID, req.Share, req.ShareSource, err)
		}
	}
	if wantsVolume {
		vols, err := volume.New()
		if err == nil {
			_, err = vols.Build(ctx)
		}
		if err != nil {
			return nil, fmt.Errorf("container %s asks for the driver volume (%s): %w", c.ID, req.Source, err)
		}
		pr.Volumes = vols
	}
	gpus := req.allocation(inv)
	if req.All && req.Share == nil && rt.StateDir != "" {
		// "all" claims nothing: it shows the GPUs no container holds.
		if gpus, pr.Allocator, err = freeView(inv, alloc); err != nil {
			return nil, fmt.Errorf("container %s: %w", c.ID, err)
		}
	}
	owner, err := ownerOf(c.ID, rt.runcRoot())
	if err != nil {
		return nil, err
	}
	if rt.StateDir != "" {
		// No holder: the container's record stands for the claim until
		// runc reports the container's init (claim.go).
		if err := rt.beginClaim(ctx, alloc, c, owner, bundle); err != nil {
			return nil, err
		}
	}
	rootfs := ""
	if spec.Root != nil {
		rootfs = spec.Root.Path
		if !filepath.IsAbs(rootfs) {
			rootfs = filepath.Join(bundle, rootfs)
		}
	}
	img := containerizer.Image{Labels: spec.Annotations, Env: env, OwnRoot: true, RootFS: rootfs}
	if wantsVolume {
		// The image's files are read here, before the state directory's
		// lock: in-root, regular files only, within ctx.
		version, err := pr.Volumes.DriverVersion(ctx)
		if err != nil {
			return nil, fmt.Errorf("container %s: driver volume: %w", c.ID, err)
		}
		compat, err := volume.CompatFor(ctx, rootfs, version, rt.Log.With("container", c.ID))
		if err != nil {
			return nil, fmt.Errorf("container %s: cuda compatibility: %w", c.ID, err)
		}
		rt.Log.Debug("cuda compatibility", "container", c.ID, "use", compat.Use, "reason", compat.Reason)
		img.Compat = &compat
	}
	var p *containerizer.Prepared
	err = alloc.Exclusive(ctx, func() error {
		if released, err := alloc.ReleaseDead(ctx); err != nil {
			return err
		} else if len(released) > 0 {
			rt.Log.Info("released the GPUs of dead containers", "owners", released)
		}
		var err error
		p, err = pr.Prepare(ctx, containerizer.Spec{ID: owner, GPUs: gpus, Env: requestEnv(req)}, img)
		return err
	})
	if err != nil {
		source := req.Source
		if req.Share != nil {
			source = strings.Join(slices.DeleteFunc([]string{req.ShareSource, req.Source}, func(s string) bool { return s == "" }), ", ")
		}
		return nil, fmt.Errorf("container %s (%s): %w", c.ID, source, err)
	}
	res := &prepared{owner: owner, alloc: alloc, p: p}
	if err := oci.Apply(&spec, p.Plan); err != nil {
		return nil, errors.Join(err, res.undo(ctx))
	}
	ownCgroup(&spec, owner, rt.RuncArgs)
	out, err := patchSpec(raw, &spec)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("container %s: %s: %w", c.ID, configPath, err), res.undo(ctx))
	}
	if err := writeAtomic(configPath, out); err != nil {
		return nil, errors.Join(fmt.Errorf("container %s: %w", c.ID, err), res.undo(ctx))
	}
	if d := p.Daemon; d != nil {
		rt.Log.Info("isolated", "container", c.ID, "request", req.ShareSource, "gpus", cli.DescribeGPUs(p.Allocation.Devices),
			"share", p.Allocation.Share.String(), "mps daemon", d.Pid, "pipe", d.PipeDir, "volume", p.Volume != nil)
		return res, nil
	}
	rt.Log.Info("isolated", "container", c.ID, "request", req.Source, "gpus", cli.DescribeGPUs(p.Allocation.Devices), "volume", p.Volume != nil)
	return res, nil
}

// ErrShareNeedsState: a share was asked of a gpuiso-runtime without
// --state-dir, where nothing would count it among the GPU's other shares
// or record its MPS daemon.
var ErrShareNeedsState = node.Sentinel(node.ErrNotSupported, "a GPU share needs --state-dir")

// sharedGPUs are the GPUs of inv that take shares (--shared-gpus; by
// default every GPU without MIG): placement packs shares onto GPUs shared
// already, and whole requests take shareable GPUs last.
func (rt *Runtime) sharedGPUs(inv *node.Inventory) []string {
	if rt.SharedGPUs != nil {
		return rt.SharedGPUs
	}
	var out []string
	for _, d := range inv.Devices {
		if !d.MIGSplit() {
			out = append(out, strconv.Itoa(d.Index))
		}
	}
	return out
}

// requestEnv is the request as NVIDIA_VISIBLE_DEVICES, set over the image's
// for the preparer: a request from Swarm or CDI asks for the driver volume
// as that variable does.
func requestEnv(r Request) []string {
	switch {
	case r.All:
		return []string{envVisibleDevices + "=all"}
	case len(r.IDs) > 0:
		return []string{envVisibleDevices + "=" + strings.Join(r.IDs, ",")}
	case r.Share != nil:
		// A share's GPU is the allocator's choice: any.
		return []string{envVisibleDevices + "=all"}
	}
	return nil
}

// undo gives back what Prepare took.
func (p *prepared) undo(ctx context.Context) error {
	return p.p.Undo(context.WithoutCancel(ctx))
}

// Create runs runc's cmd (create or run) for a prepared container that
// claims GPUs or the driver volume in the state directory, or uses the
// driver volume without one. runc inherits
// the lock of the container's record, so that the claim counts as being
// created as long as runc create, or a foreground runc run, lives. Once
// runc returns, the claim passes to the container's init if runc reports
// the container alive ("create", "run -d"), and is given back otherwise
// (a failed runc, a foreground "run" that ended); a SIGTERM meanwhile does
// not cut this short.
func (rt *Runtime) Create(ctx context.Context, res *prepared, cmd string, rest []string, c CreateArgs, stderr io.Writer) int {
	var inherit []*os.File
	if rt.claim != nil {
		inherit = append(inherit, rt.claim.lock)
	}
	code, err := runRunc(ctx, rt.runcArgv(cmd, rest), c.PreserveFDs, inherit...)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	if err != nil {
		rt.giveBack(sctx, res)
		fmt.Fprintln(stderr, refusal(err))
		rt.Log.Error(remedied(err))
		return exitRefused
	}
	rt.settleCreate(sctx, res, c, code)
	return code
}

// Delete runs runc's delete and then gives back what the container it
// names, in the runc root it names, holds, once runc no longer reports it
// alive: its GPUs, found through its record (in the state directory of
// --state-dir or, without it, the one the index names), and its use of the
// driver volume. A SIGTERM meanwhile does not cut this short.
func (rt *Runtime) Delete(ctx context.Context, id string, rest []string, stderr io.Writer) int {
	code, err := runRunc(ctx, rt.runcArgv("delete", rest), 0)
	if err != nil {
		fmt.Fprintln(stderr, refusal(err))
		rt.Log.Error(remedied(err))
		return exitRefused
	}
	if id == "" {
		return code
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	if err := rt.release(sctx, id); err != nil {
		rt.Log.Error("give back", "container", id, "err", err)
	}
	return code
}

// release gives back what container id of this command's runc root holds,
// if runc no longer reports it alive, and then settles the other records
// of its state directory.
func (rt *Runtime) release(ctx context.Context, id string) error {
	root := rt.runcRoot()
	owner, err := ownerOf(id, root)
	if err != nil {
		return nil // no container of that id was ever given anything
	}
	index := rt.IndexDir
	if index == "" {
		index = defaultIndexDir
	}
	dir := lookupIndex(index, owner)
	if dir == "" {
		dir = rt.StateDir
	}
	var rs records
	if dir != "" {
		if rs, err = rt.recordsOf(dir); err != nil {
			return err
		}
	}
	if dir == "" || !exists(rs.path(owner)) {
		// No claim: only, perhaps, a use of the driver volume.
		var errs []error
		if usesVolume(ctx, owner) {
			errs = append(errs, rt.releaseVolumeIfGone(ctx, id, root, owner))
		}
		if rt.StateDir != "" {
			errs = append(errs, rt.recoverDir(ctx, rt.StateDir, rt.Simulate, rt.DevRoot))
		}
		return errors.Join(errs...)
	}
	lock, err := rs.lock(ctx, owner, deleteLockWait)
	if err != nil {
		return err // its process, or the next create or delete, settles it
	}
	rec, err := rs.read(owner)
	if errors.Is(err, fs.ErrNotExist) {
		rs.remove(owner, lock) // settled meanwhile
		return nil
	}
	if err != nil {
		lock.Close()
		return err
	}
	alloc, err := rt.openAllocator(ctx, rs.stateDir(), rec.Simulate, rec.DevRoot)
	if err != nil {
		lock.Close()
		return err
	}
	// A created record is settled as a creating one: runc, not the init's
	// pid alone, says whether the container is gone.
	rec.Phase = phaseCreating
	released, err := rt.settle(ctx, alloc, rs, rec, lock)
	if err != nil {
		return err
	}
	if released {
		rt.Log.Info("gave back", "container", id, "root", root)
	}
	rt.recover(ctx, alloc, rs)
	return nil
}

// releaseVolumeIfGone forgets owner as a driver-volume user once runc no
// longer has container id in root alive.
func (rt *Runtime) releaseVolumeIfGone(ctx context.Context, id, root, owner string) error {
	runc, err := lookRunc(rt.Runc)
	if err != nil {
		return err
	}
	if runc, err = filepath.Abs(runc); err != nil {
		return err
	}
	init, err := ctrRecord{ID: id, Root: root, Runc: runc}.liveInit(ctx, "")
	if err != nil || init != nil {
		return err
	}
	return releaseVolumeUse(ctx, owner)
}

// recoverDir settles the records of state directory dir that no process
// holds, on the node simulate and devRoot name.
func (rt *Runtime) recoverDir(ctx context.Context, dir, simulate, devRoot string) error {
	rs, err := rt.recordsOf(dir)
	if err != nil {
		return err
	}
	owners, err := rs.owners()
	if err != nil {
		return err
	}
	if len(owners) == 0 {
		// No record: only MPS daemons may be left to stop.
		if daemons, err := rt.daemonsOf(dir, false); daemons == nil || err != nil {
			return err
		}
		if list, err := os.ReadDir(filepath.Join(rs.stateDir(), daemonsDir)); err != nil || !slices.ContainsFunc(list, fs.DirEntry.IsDir) {
			return err
		}
	}
	alloc, err := rt.openAllocator(ctx, rs.stateDir(), simulate, devRoot)
	if err != nil {
		return err
	}
	rt.recover(ctx, alloc, rs)
	return nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// writeAtomic replaces path by data: a temporary file in the same
// directory, synced, renamed over it, keeping path's mode.
func writeAtomic(path string, data []byte) error {
	mode := os.FileMode(0o644)
	if fi, err := os.Stat(path); err == nil {
		mode = fi.Mode().Perm()
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".config-*.json")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}
