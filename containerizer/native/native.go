package native

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/isolator/cgroups"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
)

// DefaultStateDir is where containers' records, /dev and exit statuses live.
const DefaultStateDir = "/run/gpuiso/native"

// Containerizer runs native GPU containers; see the package documentation.
// It is safe for concurrent use.
type Containerizer struct {
	cfg Config
	// self is this process as the supervisor of the containers it launches.
	self allocator.Holder
	prep *containerizer.Preparer
	dev  devices
	// seccomp holds the seccomp programs built so far.
	seccomp programs
	// parent is the isolator's view of its cgroup parent, when it is the
	// state directory's own (CgroupParent): then cgroups no record
	// explains are this containerizer's to remove, and so is the parent.
	parent parented
	// bare starts inits without namespaces, mounts or confinement: only
	// the package's own tests of its bookkeeping set it.
	bare bool

	// containers are the containers by id, with their states (see
	// containerizer.Table): the table of launches in progress too.
	containers containerizer.Table[*container]
	// mu guards the containers' fields.
	mu sync.Mutex
}

var _ containerizer.Containerizer = (*Containerizer)(nil)

// container is the containerizer's view of one container.
type container struct {
	rec  record
	plan *isolator.Plan
	env  []string // the command's environment, set at launch
	// exited is closed once the exit status is known.
	exited chan struct{}
	status containerizer.ExitStatus
	// child is set when this process started the init (not after a recovery).
	child *exec.Cmd
	// busy serialises Update and Destroy on the container.
	busy sync.Mutex
}

func (c *Containerizer) dir(id string) string     { return filepath.Join(c.cfg.StateDir, id) }
func (c *Containerizer) rootDir(id string) string { return filepath.Join(c.dir(id), "root") }
func (c *Containerizer) devDir(id string) string  { return filepath.Join(c.dir(id), "dev") }
func (c *Containerizer) recPath(id string) string { return filepath.Join(c.dir(id), "container.json") }
func (c *Containerizer) exitPath(id string) string {
	return filepath.Join(c.dir(id), "exit.json")
}

// Launch starts spec's command as a container; see the package documentation
// for what it gets. On error everything already done is undone.
func (c *Containerizer) Launch(ctx context.Context, spec containerizer.Spec) (containerizer.Container, error) {
	if c.prep == nil {
		return containerizer.Container{}, fmt.Errorf("launch %s: %w", spec.ID, containerizer.ErrNotMade)
	}
	if err := validate(spec, c.cfg.StateDir); err != nil {
		return containerizer.Container{}, fmt.Errorf("launch %s: %w", spec.ID, err)
	}
	ct := &container{exited: make(chan struct{})}
	ct.busy.Lock()
	if err := c.containers.Begin(spec.ID, ct); err != nil {
		ct.busy.Unlock()
		return containerizer.Container{}, fmt.Errorf("launch: %w", err)
	}
	err := c.launch(ctx, spec, ct)
	ct.busy.Unlock()
	c.containers.Settle(spec.ID, err == nil) // a Destroy waiting goes on
	if err != nil {
		return containerizer.Container{}, fmt.Errorf("launch %s: %w", spec.ID, err)
	}
	return c.describe(spec.ID, ct), nil
}

func validate(spec containerizer.Spec, stateDir string) error {
	if err := node.ValidateOwner(spec.ID); err != nil {
		return err
	}
	switch {
	case spec.Image != "":
		return fmt.Errorf("%w: an image needs the Docker containerizer", containerizer.ErrInvalidSpec)
	case len(spec.Command) == 0 || spec.Command[0] == "":
		return fmt.Errorf("%w: no command", containerizer.ErrInvalidSpec)
	case spec.Dir != "" && !filepath.IsAbs(spec.Dir):
		return fmt.Errorf("%w: working directory %q is not absolute", containerizer.ErrInvalidSpec, spec.Dir)
	}
	if _, err := confinementOf(spec); err != nil {
		return err
	}
	return checkRootFS(spec.RootFS, stateDir)
}

// launch does the work of Launch; each step registers its undo.
func (c *Containerizer) launch(ctx context.Context, spec containerizer.Spec, ct *container) (err error) {
	var undo []func()
	defer func() {
		if err != nil {
			for _, u := range slices.Backward(undo) {
				u()
			}
		}
	}()
	// Undo runs even when ctx is cancelled.
	bg := context.WithoutCancel(ctx)
	// The state directory comes first, naming its supervisor: a crash at
	// any later point leaves it behind for Recover or Clean, which then
	// give back whatever was taken.
	if err := c.claim(spec.ID); err != nil {
		return err
	}
	undo = append(undo, func() { os.RemoveAll(c.dir(spec.ID)) })
	// A container without a root file system of its own shares the host's,
	// and with it the host's driver: it gets no volume over it. One with
	// its own gets the volume when its image asks for it.
	img := containerizer.Image{Env: defaultEnv()}
	if spec.RootFS != "" {
		img = containerizer.Image{Labels: spec.Labels, OwnRoot: true, RootFS: spec.RootFS}
	}
	prep, err := c.prep.Prepare(ctx, spec, img)
	if err != nil {
		return err
	}
	undo = append(undo, func() { prep.Undo(bg) })
	plan := prep.Plan
	env := isolator.MergeEnv(isolator.MergeEnv(defaultEnv(), spec.Env), plan.Env)
	ct.rec = record{Version: recordVersion, ID: spec.ID, GPUs: prep.Allocation.Devices, Mounts: plan.Mounts, Env: planExtra(plan.Env)}
	if prep.Volume != nil {
		ct.rec.Volume, ct.rec.VolumeVersion = prep.Volume.Path, prep.Volume.Version
	}
	ct.plan, ct.env = plan, env

	if spec.RootFS == "" {
		// The mount point of the host's root, read-only, in the container.
		if err := os.Mkdir(c.rootDir(spec.ID), 0o700); err != nil {
			return err
		}
	}
	if err := c.dev.makeDev(c.devDir(spec.ID), plan.Devices); err != nil {
		c.dev.removeDev(c.devDir(spec.ID))
		return fmt.Errorf("private /dev: %w", err)
	}
	undo = append(undo, func() { c.dev.removeDev(c.devDir(spec.ID)) })
	if err := c.apply(ctx, spec.ID, plan.Rules); err != nil {
		return err
	}
	undo = append(undo, func() { c.destroyCgroup(bg, spec.ID) })
	// The record is written once the init's pid is known. A crash before
	// leaves a state directory without one, which Recover tears down.
	return c.start(ctx, spec, ct, plan)
}

// apply makes the container's cgroup. Another process on the same state
// directory may remove the empty parent between the isolator's making of
// the parent and of the container's cgroup in it: then it tries again.
func (c *Containerizer) apply(ctx context.Context, id string, rules []isolator.Rule) error {
	var err error
	for range 5 {
		if err = c.cfg.Isolator.Apply(ctx, id, rules); !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return err
}

// destroyBound bounds each removal of a cgroup: the kernel empties a
// cgroup of killed processes in milliseconds, so a cgroup still busy after
// it (a parent of cgroups not known to it, say) is reported, not waited for.
const destroyBound = 5 * time.Second

// destroyCgroup removes container id's cgroup, within destroyBound, then
// the state directory's own cgroup parent if that was its last container.
func (c *Containerizer) destroyCgroup(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(ctx, destroyBound)
	defer cancel()
	if err := c.cfg.Isolator.Destroy(ctx, id); err != nil {
		return err
	}
	c.removeParent()
	return nil
}

// removeParent removes the state directory's own cgroup parent if it is
// empty; one still in use stays.
func (c *Containerizer) removeParent() {
	if c.parent == nil {
		return
	}
	if err := c.parent.RemoveParent(); err != nil {
		c.cfg.Logger.Warn("cgroup parent left", "parent", c.parent.Parent(), "err", err)
	}
}

// planExtra is the part of a plan's environment that does not name its
// GPUs: what a new plan for other GPUs of the same container keeps.
func planExtra(env []string) []string {
	var out []string
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if k != isolator.EnvVisibleDevices && k != isolator.EnvCUDAVisibleDevices {
			out = append(out, kv)
		}
	}
	return out
}

func defaultEnv() []string {
	return []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
}

// start runs the init, moves it into the cgroup, and only then lets it go on.
func (c *Containerizer) start(ctx context.Context, spec containerizer.Spec, ct *container, plan *isolator.Plan) error {
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	defer r.Close()
	defer w.Close()
	cmd := exec.Command(c.cfg.InitPath)
	cmd.Env = []string{initEnv + "=1"}
	cmd.ExtraFiles = append([]*os.File{r}, spec.ExtraFiles...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = spec.Stdin, spec.Stdout, spec.Stderr
	cf, err := confinementOf(spec)
	if err != nil {
		return err
	}
	flags := uintptr(initCloneFlags)
	if !cf.HostNetwork {
		flags |= linux.CloneNewNet
	}
	if c.bare {
		flags = 0
	}
	cmd.SysProcAttr = linux.InitAttr(flags)
	inCgroup := false
	if c.cfg.Isolator.Version() == cgroups.V2 {
		// Born inside its cgroup (clone3 CLONE_INTO_CGROUP).
		cg, err := c.cfg.Isolator.OpenCgroup(spec.ID)
		if err != nil {
			return err
		}
		defer cg.Close()
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, int(cg.Fd())
		inCgroup = true
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start init: %w", err)
	}
	kill := func() { cmd.Process.Kill(); cmd.Wait() }
	if !inCgroup {
		if err := c.cfg.Isolator.AddProcess(ctx, spec.ID, cmd.Process.Pid); err != nil {
			kill()
			return err
		}
	}
	start, err := startTime(c.cfg.ProcRoot, cmd.Process.Pid)
	if err != nil {
		kill()
		return err
	}
	ct.rec.Pid, ct.rec.Start = cmd.Process.Pid, start
	if err := writeJSON(c.recPath(spec.ID), ct.rec); err != nil {
		kill()
		return fmt.Errorf("record: %w", err)
	}
	if cf.RootFS == "" {
		cf.HostRoot = c.rootDir(spec.ID)
	}
	cf.Hostname = hostname(spec.ID)
	if !c.bare {
		if cf.Seccomp, err = c.seccomp.get(cf.Caps); err != nil {
			kill()
			return err
		}
	}
	cfg := initConfig{Args: spec.Command, Env: ct.env, Dir: spec.Dir, DevDir: c.devDir(spec.ID), Mounts: plan.Mounts, ExitFile: c.exitPath(spec.ID), Confine: cf, ExtraFiles: len(spec.ExtraFiles), Bare: c.bare}
	if err := writeConfig(w, cfg); err != nil {
		kill()
		return fmt.Errorf("configure init: %w", err)
	}
	ct.child = cmd
	go c.reap(spec.ID, ct)
	c.cfg.Logger.Info("container launched", "id", spec.ID, "pid", cmd.Process.Pid, "gpus", len(ct.rec.GPUs), "volume", ct.rec.Volume)
	return nil
}

func writeConfig(w io.WriteCloser, cfg initConfig) error {
	b, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	if _, err := w.Write(b); err != nil {
		return err
	}
	return w.Close()
}

// reap waits for an init this process started and records how it ended.
func (c *Containerizer) reap(id string, ct *container) {
	code, _ := linux.ExitCode(ct.child.Wait())
	c.exit(id, ct, code)
}

// watch polls an adopted init (not a child of this process) until it ends,
// then takes the status the init recorded.
func (c *Containerizer) watch(id string, ct *container) {
	c.mu.Lock()
	pid, start := ct.rec.Pid, ct.rec.Start
	c.mu.Unlock()
	for alive(c.cfg.ProcRoot, pid, start) {
		time.Sleep(50 * time.Millisecond)
	}
	code := 128 + linux.SignalKill // killed before it could record anything
	var ex exitRecord
	if err := readJSON(c.exitPath(id), &ex); err == nil {
		code = ex.Code
	}
	c.exit(id, ct, code)
}

// exit records how container id, ct, ended, once.
func (c *Containerizer) exit(id string, ct *container, code int) {
	c.mu.Lock()
	select {
	case <-ct.exited:
		c.mu.Unlock()
		return
	default:
	}
	ct.status = containerizer.ExitStatus{Code: code}
	close(ct.exited)
	c.mu.Unlock()
	_, _ = c.containers.Exited(id, ct) // refused for none: exited is after every state it can have
}

// Wait blocks until the container's command has exited.
func (c *Containerizer) Wait(ctx context.Context, id string) (containerizer.ExitStatus, error) {
	ct, err := c.get(id)
	if err != nil {
		return containerizer.ExitStatus{}, fmt.Errorf("wait for %s: %w", id, err)
	}
	select {
	case <-ct.exited:
		c.mu.Lock()
		defer c.mu.Unlock()
		return ct.status, nil
	case <-ctx.Done():
		return containerizer.ExitStatus{}, fmt.Errorf("wait for %s: %w", id, ctx.Err())
	}
}

func (c *Containerizer) get(id string) (*container, error) {
	ct, _, err := c.containers.Get(id)
	if err != nil {
		return nil, containerizer.ErrUnknownContainer
	}
	return ct, nil
}

// Destroy kills every process of the container, removes its cgroup, /dev and
// state, and releases its GPUs and volume. A container already gone is not
// an error. A cgroup that stays busy for seconds after its processes were
// killed (one stuck in the kernel) is reported rather than waited for;
// Destroy, or a later Clean or Recover, can try again.
func (c *Containerizer) Destroy(ctx context.Context, id string) error {
	if err := node.ValidateOwner(id); err != nil {
		return fmt.Errorf("destroy %s: %w", id, err)
	}
	// A container being launched is destroyed once its launch has ended.
	ct, _, ok, err := c.containers.Destroying(ctx, id)
	if err != nil {
		return fmt.Errorf("destroy: %w", err)
	}
	if !ok {
		return nil // unknown, or its launch failed and undid everything
	}
	ct.busy.Lock() // waits for an update in progress
	defer ct.busy.Unlock()
	if err := c.teardown(ctx, id, ct.rec); err != nil {
		return errors.Join(fmt.Errorf("destroy %s: %w", id, err), c.containers.Restore(id, false))
	}
	if ct.child != nil {
		<-ct.exited // reaped: the cgroup's processes are gone
	} else {
		c.exit(id, ct, 128+linux.SignalKill)
	}
	if err := c.containers.Remove(id); err != nil {
		return fmt.Errorf("destroy: %w", err)
	}
	c.cfg.Logger.Info("container destroyed", "id", id)
	return nil
}

// teardown gives back everything a container held, in the reverse order of
// launch. Every step tolerates what is already gone.
func (c *Containerizer) teardown(ctx context.Context, id string, rec record) error {
	if err := c.destroyCgroup(ctx, id); err != nil {
		return err
	}
	var errs []error
	if err := c.dev.removeDev(c.devDir(id)); err != nil {
		errs = append(errs, err)
	}
	if c.cfg.Volumes != nil && rec.VolumeVersion != "" {
		if err := c.cfg.Volumes.Release(ctx, rec.VolumeVersion, id); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	} else if c.cfg.Volumes != nil {
		// Killed between acquiring a volume and its first record.
		if err := c.releaseVolumeUser(ctx, id); err != nil {
			errs = append(errs, err)
		}
	}
	if err := c.cfg.Allocator.Release(ctx, id); err != nil && !errors.Is(err, allocator.ErrUnknownOwner) {
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		if err := c.removeDir(id); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Containers lists the containers, by id (launches in progress aside).
func (c *Containerizer) Containers() []containerizer.Container {
	var out []containerizer.Container
	for _, e := range c.containers.List(false) {
		out = append(out, c.describe(e.ID, e.Value))
	}
	return out
}

// describe is container id, ct, as the containerizer shows it.
func (c *Containerizer) describe(id string, ct *container) containerizer.Container {
	_, st, _ := c.containers.Get(id)
	if st == containerizer.StateLaunching {
		st = containerizer.StateRunning // Launch describes it as it returns
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return containerizer.Container{
		ID: id, Kind: containerizer.KindNative, GPUs: slices.Clone(ct.rec.GPUs),
		Volume: ct.rec.Volume, Pid: ct.rec.Pid, State: st,
	}
}

// Usage reports what the container's processes use of its GPUs, as NVML
// tells: memory per GPU and, where the driver keeps samples, utilisation.
// Without NVML (Config.NVML) it fails with an error matching
// isolator.ErrNotSupported.
func (c *Containerizer) Usage(ctx context.Context, id string) (nvmlnode.Usage, error) {
	if c.prep == nil {
		return nvmlnode.Usage{}, fmt.Errorf("usage of %s: %w", id, containerizer.ErrNotMade)
	}
	ct, err := c.get(id)
	if err != nil {
		return nvmlnode.Usage{}, fmt.Errorf("usage of %s: %w", id, err)
	}
	if c.cfg.NVML == nil {
		return nvmlnode.Usage{}, fmt.Errorf("usage of %s: no NVML: %w", id, isolator.ErrNotSupported)
	}
	if ret := c.cfg.NVML.Init(); ret != nvml.SUCCESS {
		return nvmlnode.Usage{}, fmt.Errorf("usage of %s: %w", id, &nvmlnode.NVMLError{Op: "init", Device: -1, Return: ret})
	}
	defer c.cfg.NVML.Shutdown()
	pids, err := c.cfg.Isolator.Processes(ctx, id)
	if err != nil {
		return nvmlnode.Usage{}, fmt.Errorf("usage of %s: %w", id, err)
	}
	c.mu.Lock()
	gpus := slices.Clone(ct.rec.GPUs)
	c.mu.Unlock()
	u, err := nvmlnode.ReadUsage(ctx, c.cfg.NVML, gpus, pids)
	if err != nil {
		return u, fmt.Errorf("usage of %s: %w", id, err)
	}
	return u, nil
}
