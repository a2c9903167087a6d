package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/internal/cli"
	"github.com/gpuiso/gpuiso/isolator/oci"
	"github.com/gpuiso/gpuiso/volume"
)

// Runtime carries out the commands gpuiso-runtime does not simply hand to
// runc.
type Runtime struct {
	Settings
	Log *slog.Logger
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
	req, err := requestOf(&spec, rt.CDIKind, rt.SwarmResources)
	if err != nil {
		return nil, fmt.Errorf("container %s: %w", c.ID, err)
	}
	var env []string
	if spec.Process != nil {
		env = spec.Process.Env
	}
	// A container given GPUs gets the driver to use them with, wherever
	// the request came from.
	wantsVolume := !req.None() || volume.Image{Labels: spec.Annotations, Env: env}.NeedsVolume()
	if req.None() && !wantsVolume {
		rt.Log.Debug("no GPU asked for: passed through", "container", c.ID)
		return nil, nil
	}

	inv, devRoot, err := openNode(ctx, rt.Settings)
	if err != nil {
		return nil, fmt.Errorf("container %s: %w", c.ID, err)
	}
	var opts []allocator.Option
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
	pr := &containerizer.Preparer{Allocator: alloc, Inventory: inv, DevRoot: devRoot}
	if wantsVolume {
		vols, note := cli.DriverVolume(ctx)
		if vols == nil {
			return nil, fmt.Errorf("container %s asks for the driver volume (%s): %s", c.ID, req.Source, note)
		}
		pr.Volumes = vols
	}
	gpus := req.allocation(inv)
	if !req.None() && rt.StateDir != "" {
		h, err := allocator.ProcessHolder("", os.Getpid())
		if err != nil {
			return nil, err
		}
		gpus.Holder = &h // until the container's init holds it
	}
	rootfs := ""
	if spec.Root != nil {
		rootfs = spec.Root.Path
		if !filepath.IsAbs(rootfs) {
			rootfs = filepath.Join(bundle, rootfs)
		}
	}
	img := containerizer.Image{Labels: spec.Annotations, Env: env, OwnRoot: true, RootFS: rootfs}
	var p *containerizer.Prepared
	err = alloc.Exclusive(ctx, func() error {
		if released, err := alloc.ReleaseDead(ctx); err != nil {
			return err
		} else if len(released) > 0 {
			rt.Log.Info("released the GPUs of dead containers", "owners", released)
		}
		var err error
		p, err = pr.Prepare(ctx, containerizer.Spec{ID: c.ID, GPUs: gpus, Env: requestEnv(req)}, img)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("container %s (%s): %w", c.ID, req.Source, err)
	}
	res := &prepared{owner: c.ID, alloc: alloc, p: p}
	if err := oci.Apply(&spec, p.Plan); err != nil {
		return nil, errors.Join(err, res.undo(ctx))
	}
	out, err := json.Marshal(&spec)
	if err != nil {
		return nil, errors.Join(err, res.undo(ctx))
	}
	if err := writeAtomic(configPath, out); err != nil {
		return nil, errors.Join(fmt.Errorf("container %s: %w", c.ID, err), res.undo(ctx))
	}
	rt.Log.Info("isolated", "container", c.ID, "request", req.Source, "gpus", cli.DescribeGPUs(p.Allocation.Devices), "volume", p.Volume != nil)
	return res, nil
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
	}
	return nil
}

// undo gives back what Prepare took.
func (p *prepared) undo(ctx context.Context) error {
	return p.p.Undo(context.WithoutCancel(ctx))
}

// Create runs runc's cmd (create or run) for a prepared container that
// owns GPUs in the state directory. Once runc created it, the claim passes
// to the container's init process, so that it ends when the container
// dies; "run" keeps it with this process, which lives as long. A failed
// runc gives everything back.
func (rt *Runtime) Create(ctx context.Context, res *prepared, cmd string, rest []string, c CreateArgs, stderr io.Writer) int {
	code, err := runRunc(ctx, rt.runcArgv(cmd, rest), c.PreserveFDs)
	if err != nil || code != 0 || cmd == "run" {
		if uerr := res.undo(ctx); uerr != nil {
			rt.Log.Error("give back after runc", "container", c.ID, "err", uerr)
		}
		if err != nil {
			fmt.Fprintf(stderr, "gpuiso-runtime: %v\n", err)
			rt.Log.Error(err.Error())
			return exitRefused
		}
		return code
	}
	if len(res.p.Allocation.Devices) == 0 {
		return 0
	}
	pid, err := rt.initPid(ctx, c.ID)
	var h allocator.Holder
	if err == nil {
		h, err = allocator.ProcessHolder("", pid)
	}
	if err == nil {
		err = res.alloc.SetHolder(ctx, c.ID, &h)
	}
	if err != nil {
		// The claim stays with this process and ends with it: the GPUs are
		// free again for the next container after this one.
		rt.Log.Error("hand the claim to the container's init", "container", c.ID, "err", err)
	}
	return 0
}

// initPid asks runc for the pid of container id's init process.
func (rt *Runtime) initPid(ctx context.Context, id string) (int, error) {
	argv := rt.runcArgv("state", []string{id})
	path, err := lookRunc(argv[0])
	if err != nil {
		return 0, err
	}
	out, err := exec.CommandContext(ctx, path, argv[1:]...).Output()
	if err != nil {
		return 0, fmt.Errorf("runc state %s: %w", id, err)
	}
	var st struct {
		Pid int `json:"pid"`
	}
	if err := json.Unmarshal(out, &st); err != nil || st.Pid <= 0 {
		return 0, fmt.Errorf("runc state %s: no pid in %q", id, bytes.TrimSpace(out))
	}
	return st.Pid, nil
}

// Delete runs runc's delete and, once the container is gone, gives back its
// GPUs and its use of the driver volume.
func (rt *Runtime) Delete(ctx context.Context, id string, rest []string, stderr io.Writer) int {
	code, err := runRunc(ctx, rt.runcArgv("delete", rest), 0)
	if err != nil {
		fmt.Fprintf(stderr, "gpuiso-runtime: %v\n", err)
		rt.Log.Error(err.Error())
		return exitRefused
	}
	if code != 0 || id == "" {
		return code
	}
	if err := rt.release(ctx, id); err != nil {
		rt.Log.Error("give back", "container", id, "err", err)
	}
	return 0
}

// release gives back what container id holds: its GPUs in the state
// directory, if one is set, and its use of the driver volume.
func (rt *Runtime) release(ctx context.Context, id string) error {
	var errs []error
	if rt.StateDir != "" {
		errs = append(errs, rt.releaseGPUs(ctx, id))
	}
	if vols, err := volume.New(); err == nil {
		if list, err := vols.List(ctx); err == nil {
			for _, v := range list {
				errs = append(errs, vols.Release(ctx, v.Version, id))
			}
		}
	}
	return errors.Join(errs...)
}

// releaseGPUs gives back the GPUs container id holds in the state directory.
func (rt *Runtime) releaseGPUs(ctx context.Context, id string) error {
	dir, err := filepath.Abs(rt.StateDir)
	if err != nil {
		return err
	}
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil // nothing was ever claimed
	}
	inv, _, err := openNode(ctx, rt.Settings)
	if err != nil {
		return err
	}
	alloc, err := allocator.New(inv, allocator.WithStateDir(dir))
	if err != nil {
		return err
	}
	if err := alloc.Release(ctx, id); err != nil && !errors.Is(err, allocator.ErrUnknownOwner) {
		return err
	}
	return nil
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
