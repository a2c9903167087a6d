package docker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/volume"
)

// Labels the containerizer adds to those of the Docker isolator (owner and
// GPUs).
const (
	// LabelNamespace holds the namespace of the containerizer that created
	// the container; Recover adopts only its own namespace's containers.
	LabelNamespace = "io.gpuiso.namespace"
	// LabelVolume holds the driver version of the volume the container
	// mounts, when it mounts one.
	LabelVolume = "io.gpuiso.volume"
)

// DefaultNamespace is the namespace of a containerizer built without
// WithNamespace.
const DefaultNamespace = "default"

// Client is what the containerizer asks of the Docker API; a
// *client.Client from github.com/moby/moby/client has it.
type Client interface {
	ImageInspect(ctx context.Context, image string, opts ...client.ImageInspectOption) (client.ImageInspectResult, error)
	ContainerCreate(ctx context.Context, opts client.ContainerCreateOptions) (client.ContainerCreateResult, error)
	ContainerAttach(ctx context.Context, id string, opts client.ContainerAttachOptions) (client.ContainerAttachResult, error)
	ContainerStart(ctx context.Context, id string, opts client.ContainerStartOptions) (client.ContainerStartResult, error)
	ContainerWait(ctx context.Context, id string, opts client.ContainerWaitOptions) client.ContainerWaitResult
	ContainerInspect(ctx context.Context, id string, opts client.ContainerInspectOptions) (client.ContainerInspectResult, error)
	ContainerStop(ctx context.Context, id string, opts client.ContainerStopOptions) (client.ContainerStopResult, error)
	ContainerRemove(ctx context.Context, id string, opts client.ContainerRemoveOptions) (client.ContainerRemoveResult, error)
	ContainerList(ctx context.Context, opts client.ContainerListOptions) (client.ContainerListResult, error)
}

var _ Client = (*client.Client)(nil)

// Option configures a Containerizer.
type Option func(*config) error

type config struct {
	devRoot     string
	volumes     *volume.Manager
	namespace   string
	stopTimeout time.Duration
	reconcile   bool
	logger      *slog.Logger
	cdiKind     string // WithCDI; "" for device mappings always
	labels      map[string]string
	supervisor  *allocator.Holder // WithSupervisor
}

// WithDevRoot sets the host directory holding the GPUs' device nodes
// (default /dev; a simulated node's dev root in tests).
func WithDevRoot(dir string) Option {
	return func(c *config) error {
		if !filepath.IsAbs(dir) {
			return fmt.Errorf("dev root %q: not an absolute path", dir)
		}
		c.devRoot = filepath.Clean(dir)
		return nil
	}
}

// WithVolumes gives the containerizer the driver volume manager; without
// it, images that need the volume are refused with ErrNoVolume.
func WithVolumes(m *volume.Manager) Option {
	return func(c *config) error {
		c.volumes = m
		return nil
	}
}

// WithNamespace sets the value of LabelNamespace, so that several
// containerizers can share one daemon without adopting each other's
// containers. It must be a valid owner id (see node.ValidateOwner).
func WithNamespace(ns string) Option {
	return func(c *config) error {
		if err := node.ValidateOwner(ns); err != nil {
			return fmt.Errorf("namespace: %w", err)
		}
		c.namespace = ns
		return nil
	}
}

// WithLabels adds labels to every container the containerizer creates (a
// supervisor's identity, for instance). Labels under "io.gpuiso." are the
// containerizer's own and refused here.
func WithLabels(labels map[string]string) Option {
	return func(c *config) error {
		for k := range labels {
			if k == "" || strings.HasPrefix(k, "io.gpuiso.") && !strings.HasPrefix(k, "io.gpuiso.x.") {
				return fmt.Errorf("label %q: empty or reserved (io.gpuiso.*, but io.gpuiso.x.* is free)", k)
			}
		}
		if c.labels == nil {
			c.labels = map[string]string{}
		}
		maps.Copy(c.labels, labels)
		return nil
	}
}

// WithStopTimeout sets how long Destroy lets a container stop on SIGTERM
// before it is killed (default 10 s).
func WithStopTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d < 0 {
			return fmt.Errorf("stop timeout %v: negative", d)
		}
		c.stopTimeout = d
		return nil
	}
}

// WithReconcileAllocator says that the allocator serves this containerizer
// alone: Recover then also releases the allocations of owners it has no
// container for (those that vanished while no containerizer ran). Leave it
// out when the allocator is shared: containerizer.Composite reconciles
// against every back end's containers.
func WithReconcileAllocator() Option {
	return func(c *config) error {
		c.reconcile = true
		return nil
	}
}

// WithLogger sets the logger (default: none).
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return fmt.Errorf("nil logger: %w", node.ErrInvalid)
		}
		c.logger = l
		return nil
	}
}

// Containerizer runs containers through the Docker daemon (see the package
// documentation). It is safe for concurrent use.
type Containerizer struct {
	cli   Client
	alloc *allocator.Allocator
	inv   *node.Inventory
	cfg   config
	prep  *containerizer.Preparer

	// containers are the containers by id, with their states (see
	// containerizer.Table): the table of launches in progress too.
	containers containerizer.Table[*entry]

	mu       sync.Mutex // guards the entries' fields and the CDI choice
	cdi      bool       // the daemon takes CDI requests (once cdiKnown)
	cdiKnown bool
}

var _ containerizer.Containerizer = (*Containerizer)(nil)

// entry is a container the containerizer knows of. While it is launching
// its id is reserved and nothing else about it is settled.
type entry struct {
	c        containerizer.Container
	version  string // driver volume version, "" for none
	exit     *containerizer.ExitStatus
	streamed chan struct{} // closed when the output is copied; nil when not attached
}

// New returns a containerizer that runs containers on the daemon cli talks
// to, with GPUs of alloc, whose node inv describes.
func New(cli Client, alloc *allocator.Allocator, inv *node.Inventory, opts ...Option) (*Containerizer, error) {
	if cli == nil || alloc == nil || inv == nil {
		return nil, fmt.Errorf("docker containerizer: nil client, allocator or inventory: %w", node.ErrInvalid)
	}
	cfg := config{
		devRoot:     node.DefaultDevRoot,
		namespace:   DefaultNamespace,
		stopTimeout: 10 * time.Second,
		logger:      slog.New(slog.DiscardHandler),
	}
	for _, o := range opts {
		if err := o(&cfg); err != nil {
			return nil, fmt.Errorf("docker containerizer: %w", err)
		}
	}
	z := &Containerizer{cli: cli, alloc: alloc, inv: inv.Clone(), cfg: cfg}
	z.prep = &containerizer.Preparer{Allocator: alloc, Inventory: z.inv, Volumes: cfg.volumes, DevRoot: cfg.devRoot}
	return z, nil
}

// Namespace returns the containerizer's namespace (see WithNamespace).
func (z *Containerizer) Namespace() string { return z.cfg.namespace }

// cleanupCtx is a context for undoing work after ctx may have ended.
func cleanupCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
}

// Launch runs spec.Image with its GPUs (see the package documentation).
// spec.Command replaces the image's CMD, spec.Env is set over the image's
// environment, spec.Dir is the working directory; a spec with Stdin is
// refused (ErrNotSupported): the containerizer attaches output only. On error
// nothing is left: no container, no allocation, no volume use.
func (z *Containerizer) Launch(ctx context.Context, spec containerizer.Spec) (c containerizer.Container, err error) {
	if z.cli == nil || z.alloc == nil {
		return c, fmt.Errorf("launch %s: %w", spec.ID, containerizer.ErrNotMade)
	}
	if err := node.ValidateOwner(spec.ID); err != nil {
		return c, fmt.Errorf("launch %q: %w: %w", spec.ID, containerizer.ErrInvalidSpec, err)
	}
	if spec.Image == "" {
		return c, fmt.Errorf("launch %s: %w: no image", spec.ID, containerizer.ErrInvalidSpec)
	}
	if _, err := containerizer.ParseNetwork(string(spec.Network)); err != nil {
		return c, fmt.Errorf("launch %s: %w", spec.ID, err)
	}
	if len(spec.ExtraFiles) > 0 {
		return c, fmt.Errorf("launch %s: extra files for a docker container: %w", spec.ID, containerizer.ErrNotSupported)
	}
	if spec.Stdin != nil {
		return c, fmt.Errorf("launch %s: standard input for a docker container: %w", spec.ID, containerizer.ErrNotSupported)
	}
	e := &entry{}
	if err := z.containers.Begin(spec.ID, e); err != nil {
		return c, fmt.Errorf("launch: %w", err)
	}
	var undo []func(context.Context)
	defer func() {
		if err != nil {
			cctx, cancel := cleanupCtx(ctx)
			defer cancel()
			for _, f := range slices.Backward(undo) {
				f(cctx)
			}
		}
		z.containers.Settle(spec.ID, err == nil) // a Destroy waiting goes on
	}()

	// Decide from the image, before anything is held.
	insp, err := z.cli.ImageInspect(ctx, spec.Image)
	if err != nil {
		return c, fmt.Errorf("launch %s: %w", spec.ID, daemonErr("inspect image "+spec.Image, err))
	}
	img := containerizer.Image{OwnRoot: true}
	if insp.Config != nil {
		img.Labels, img.Env = insp.Config.Labels, insp.Config.Env
	}
	if z.cfg.supervisor != nil && spec.GPUs.Holder == nil {
		h := *z.cfg.supervisor
		spec.GPUs.Holder = &h
	}
	prep, err := z.prep.Prepare(ctx, spec, img)
	if err != nil {
		return c, fmt.Errorf("launch %s: image %s: %w", spec.ID, spec.Image, err)
	}
	undo = append(undo, func(ctx context.Context) { prep.Undo(ctx) })
	plan, vol, alloc := prep.Plan, prep.Volume, prep.Allocation
	dcfg, err := z.dockerConfig(ctx, plan)
	if err != nil {
		return c, fmt.Errorf("launch %s: %w", spec.ID, err)
	}
	cfg := &container.Config{
		Image:      spec.Image,
		Cmd:        slices.Clone(spec.Command),
		Env:        slices.Clone(spec.Env),
		WorkingDir: spec.Dir,
		Labels:     map[string]string{LabelNamespace: z.cfg.namespace},
	}
	if vol != nil {
		cfg.Labels[LabelVolume] = vol.Version
	}
	for k, v := range z.cfg.labels {
		cfg.Labels[k] = v
	}
	if z.cfg.supervisor != nil {
		cfg.Labels[LabelSupervisor] = formatSupervisor(*z.cfg.supervisor)
	}
	hc := &container.HostConfig{}
	if spec.Network != containerizer.NetworkPrivate {
		hc.NetworkMode = container.NetworkMode(spec.Network) // "none" or "host", checked at validation
	}
	if err := dcfg.Apply(cfg, hc); err != nil {
		return c, fmt.Errorf("launch %s: %w", spec.ID, err)
	}

	created, err := z.cli.ContainerCreate(ctx, client.ContainerCreateOptions{Config: cfg, HostConfig: hc})
	if err != nil {
		return c, fmt.Errorf("launch %s: %w", spec.ID, daemonErr("create container", err))
	}
	undo = append(undo, func(ctx context.Context) {
		z.cli.ContainerRemove(ctx, created.ID, client.ContainerRemoveOptions{Force: true})
	})

	var streamed chan struct{}
	if spec.Stdout != nil || spec.Stderr != nil {
		att, err := z.cli.ContainerAttach(ctx, created.ID, client.ContainerAttachOptions{Stream: true, Stdout: true, Stderr: true})
		if err != nil {
			return c, fmt.Errorf("launch %s: %w", spec.ID, daemonErr("attach container", err))
		}
		streamed = make(chan struct{})
		go copyOutput(att.HijackedResponse, spec.Stdout, spec.Stderr, streamed)
		undo = append(undo, func(context.Context) { att.Close() })
	}
	if _, err := z.cli.ContainerStart(ctx, created.ID, client.ContainerStartOptions{}); err != nil {
		return c, fmt.Errorf("launch %s: %w", spec.ID, daemonErr("start container", err))
	}

	c = containerizer.Container{ID: spec.ID, Kind: containerizer.KindDocker, GPUs: slices.Clone(alloc.Devices), RuntimeID: created.ID, State: containerizer.StateRunning}
	if vol != nil {
		c.Volume = vol.Path
	}
	z.mu.Lock()
	e.c, e.streamed = c, streamed
	if vol != nil {
		e.version = vol.Version
	}
	z.mu.Unlock()
	z.cfg.logger.InfoContext(ctx, "launched", "id", spec.ID, "container", created.ID, "gpus", len(c.GPUs), "volume", c.Volume)
	return copyContainer(c), nil
}

// copyOutput demultiplexes a container's attached output onto its writers.
func copyOutput(att client.HijackedResponse, stdout, stderr io.Writer, done chan<- struct{}) {
	defer close(done)
	defer att.Close()
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	stdcopy.StdCopy(stdout, stderr, att.Reader)
}

func copyContainer(c containerizer.Container) containerizer.Container {
	c.GPUs = slices.Clone(c.GPUs)
	return c
}

// lookup returns the settled entry of id.
func (z *Containerizer) lookup(id string) (*entry, containerizer.Container, error) {
	e, st, err := z.containers.Get(id)
	if err != nil || st == containerizer.StateLaunching {
		return nil, containerizer.Container{}, fmt.Errorf("%s: %w", id, containerizer.ErrUnknownContainer)
	}
	z.mu.Lock()
	defer z.mu.Unlock()
	c := copyContainer(e.c)
	c.State = st
	return e, c, nil
}

// Wait blocks until the container exits and its output is copied, and
// returns its exit status.
func (z *Containerizer) Wait(ctx context.Context, id string) (containerizer.ExitStatus, error) {
	if z.cli == nil || z.alloc == nil {
		return containerizer.ExitStatus{}, fmt.Errorf("wait %s: %w", id, containerizer.ErrNotMade)
	}
	e, c, err := z.lookup(id)
	if err != nil {
		return containerizer.ExitStatus{}, fmt.Errorf("wait: %w", err)
	}
	z.mu.Lock()
	exit, streamed := e.exit, e.streamed
	z.mu.Unlock()
	if exit != nil {
		return *exit, nil
	}
	res := z.cli.ContainerWait(ctx, c.RuntimeID, client.ContainerWaitOptions{Condition: container.WaitConditionNotRunning})
	var status containerizer.ExitStatus
	select {
	case r := <-res.Result:
		if r.Error != nil && r.Error.Message != "" {
			return status, fmt.Errorf("wait %s: %s", id, r.Error.Message)
		}
		status.Code = int(r.StatusCode)
	case err := <-res.Error:
		return status, fmt.Errorf("wait %s: %w", id, daemonErr("wait container", err))
	}
	if streamed != nil {
		select {
		case <-streamed:
		case <-ctx.Done():
			return status, fmt.Errorf("wait %s: output: %w", id, ctx.Err())
		}
	}
	z.mu.Lock()
	e.exit = &status
	z.mu.Unlock()
	_, _ = z.containers.Exited(id, e) // refused for none: exited is after every state it can have
	return status, nil
}

// Update always fails with an error matching containerizer.ErrNotSupported
// (or ErrUnknownContainer) and changes nothing: the Docker daemon cannot
// change the device rules of a created container (moby #42255). Destroy the
// container and launch it again with the new count instead.
func (z *Containerizer) Update(ctx context.Context, id string, gpus int) (containerizer.Container, error) {
	if _, _, err := z.lookup(id); err != nil {
		return containerizer.Container{}, fmt.Errorf("update: %w", err)
	}
	return containerizer.Container{}, fmt.Errorf("update %s to %d gpus: docker cannot change the devices of a created container (moby #42255): %w", id, gpus, containerizer.ErrNotSupported)
}

// Destroy stops and removes the container and releases its GPUs and its use
// of the volume. An unknown container is not an error. When the daemon does
// not answer, the error matches ErrDaemonUnavailable and the container is
// still known, to be destroyed again later.
func (z *Containerizer) Destroy(ctx context.Context, id string) error {
	if z.cli == nil || z.alloc == nil {
		return fmt.Errorf("destroy %s: %w", id, containerizer.ErrNotMade)
	}
	// A container being launched is destroyed once its launch has ended.
	e, _, ok, err := z.containers.Destroying(ctx, id)
	if err != nil {
		return fmt.Errorf("destroy: %w", err)
	}
	if !ok {
		return nil
	}
	if err := z.destroy(ctx, id, e); err != nil {
		z.mu.Lock()
		exited := e.exit != nil
		z.mu.Unlock()
		return errors.Join(err, z.containers.Restore(id, exited))
	}
	return z.containers.Remove(id)
}

// destroy stops and removes e's container and gives back what it held.
func (z *Containerizer) destroy(ctx context.Context, id string, e *entry) error {
	z.mu.Lock()
	exited, version, c := e.exit != nil, e.version, copyContainer(e.c)
	z.mu.Unlock()
	if !exited {
		secs := int(z.cfg.stopTimeout / time.Second)
		_, err := z.cli.ContainerStop(ctx, c.RuntimeID, client.ContainerStopOptions{Timeout: &secs})
		if err != nil && !cerrdefs.IsNotFound(err) {
			return fmt.Errorf("destroy %s: %w", id, daemonErr("stop container", err))
		}
	}
	_, err := z.cli.ContainerRemove(ctx, c.RuntimeID, client.ContainerRemoveOptions{Force: true})
	if err != nil && !cerrdefs.IsNotFound(err) {
		return fmt.Errorf("destroy %s: %w", id, daemonErr("remove container", err))
	}
	if err := z.release(ctx, id, version); err != nil {
		return fmt.Errorf("destroy %s: %w", id, err)
	}
	z.cfg.logger.InfoContext(ctx, "destroyed", "id", id, "container", c.RuntimeID)
	return nil
}

// release gives back what owner held: its GPUs and its use of the volume.
func (z *Containerizer) release(ctx context.Context, owner, version string) error {
	var errs []error
	if err := z.alloc.Release(ctx, owner); err != nil && !errors.Is(err, allocator.ErrUnknownOwner) {
		errs = append(errs, err)
	}
	if version != "" && z.cfg.volumes != nil {
		errs = append(errs, z.cfg.volumes.Release(ctx, version, owner))
	}
	return errors.Join(errs...)
}

// Containers lists the containers the containerizer knows of, by id
// (copies).
func (z *Containerizer) Containers() []containerizer.Container {
	var out []containerizer.Container
	for _, x := range z.containers.List(false) {
		z.mu.Lock()
		c := copyContainer(x.Value.c)
		z.mu.Unlock()
		c.State = x.State
		out = append(out, c)
	}
	return out
}
