package docker

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/isolator/dockerconfig"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/volume"
)

// Runtime is the Docker daemon as a containerizer.Runtime: it creates,
// starts, waits for, stops and removes containers, and lists those of its
// namespace with what their labels record (owner, GPUs, volume,
// supervisor). A containerizer.Lifecycle decides the rest; New builds one.
type Runtime struct {
	cli Client
	cfg config

	mu       sync.Mutex
	streams  map[string]*stream // by Docker container id
	cdi      bool               // the daemon takes CDI requests (once cdiKnown)
	cdiKnown bool
}

var _ containerizer.Maker = (*Runtime)(nil)

// Made tells whether r was made by NewRuntime (containerizer.Maker).
func (r *Runtime) Made() bool { return r != nil && r.cli != nil }

// The Runtime is no containerizer.Updater: the Docker daemon cannot change
// the device rules of a created container (moby #42255), so the Lifecycle
// refuses Update with containerizer.ErrNotSupported.
var (
	_ containerizer.Runtime    = (*Runtime)(nil)
	_ containerizer.Supervised = (*Runtime)(nil)
)

// stream is a container's attached output, copied onto the spec's writers.
type stream struct {
	att  client.HijackedResponse
	done chan struct{} // closed when the output is copied
}

// NewRuntime returns the runtime of the daemon cli talks to, for a
// containerizer.Lifecycle alone (what New builds) or beside other runtimes
// over one allocator. Of the options, the Lifecycle takes the driver
// volume manager and the MPS manager from its own configuration: give it
// the manager given WithVolumes (where the runtime finds a container's
// volume again); WithMPS matters only to New.
func NewRuntime(cli Client, opts ...Option) (*Runtime, error) {
	if cli == nil {
		return nil, fmt.Errorf("docker runtime: nil client: %w", node.ErrInvalid)
	}
	cfg := config{
		namespace:   DefaultNamespace,
		stopTimeout: 10 * time.Second,
		logger:      slog.New(slog.DiscardHandler),
	}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("docker containerizer: nil option: %w", node.ErrInvalid)
		}
		if err := o(&cfg); err != nil {
			return nil, fmt.Errorf("docker containerizer: %w", err)
		}
	}
	return &Runtime{cli: cli, cfg: cfg, streams: map[string]*stream{}}, nil
}

// Kind is containerizer.KindDocker.
func (r *Runtime) Kind() containerizer.Kind { return containerizer.KindDocker }

// Image checks that spec suits a Docker container (an image; no standard
// input or extra files: output is attached only) and returns the image's
// labels and environment, which decide the driver volume and the
// requirements.
func (r *Runtime) Image(ctx context.Context, spec containerizer.Spec) (containerizer.Image, error) {
	switch {
	case spec.Image == "":
		return containerizer.Image{}, fmt.Errorf("%w: no image", containerizer.ErrInvalidSpec)
	case len(spec.ExtraFiles) > 0:
		return containerizer.Image{}, fmt.Errorf("extra files for a docker container: %w", containerizer.ErrNotSupported)
	case spec.Stdin != nil:
		return containerizer.Image{}, fmt.Errorf("standard input for a docker container: %w", containerizer.ErrNotSupported)
	}
	if _, err := containerizer.ParseNetwork(string(spec.Network)); err != nil {
		return containerizer.Image{}, err
	}
	insp, err := r.cli.ImageInspect(ctx, spec.Image)
	if err != nil {
		return containerizer.Image{}, daemonErr("inspect image "+spec.Image, err)
	}
	img := containerizer.Image{OwnRoot: true}
	if insp.Config != nil {
		img.Labels, img.Env = insp.Config.Labels, insp.Config.Env
	}
	return img, nil
}

// Create creates spec's container with the Docker isolator's configuration
// of p and the containerizer's labels, and attaches its output before it
// starts, so none is lost.
func (r *Runtime) Create(ctx context.Context, spec containerizer.Spec, p *containerizer.Prepared) (containerizer.Record, error) {
	dcfg, err := r.dockerConfig(ctx, p.Plan)
	if err != nil {
		return containerizer.Record{}, err
	}
	cfg := &container.Config{
		Image:      spec.Image,
		Cmd:        slices.Clone(spec.Command),
		Env:        slices.Clone(spec.Env),
		WorkingDir: spec.Dir,
		Labels:     map[string]string{LabelNamespace: r.cfg.namespace},
	}
	if p.Volume != nil {
		cfg.Labels[LabelVolume] = p.Volume.Version
	}
	if s := p.Allocation.Share; s != nil {
		b, err := json.Marshal(s)
		if err != nil {
			return containerizer.Record{}, err
		}
		cfg.Labels[LabelShare] = string(b)
	}
	for k, v := range r.cfg.labels {
		cfg.Labels[k] = v
	}
	if r.cfg.supervisor != nil {
		cfg.Labels[LabelSupervisor] = formatSupervisor(*r.cfg.supervisor)
	}
	hc := &container.HostConfig{NetworkMode: networkMode(spec.Network)}
	if err := dcfg.Apply(cfg, hc); err != nil {
		return containerizer.Record{}, err
	}
	created, err := r.cli.ContainerCreate(ctx, client.ContainerCreateOptions{Config: cfg, HostConfig: hc})
	if err != nil {
		return containerizer.Record{}, daemonErr("create container", err)
	}
	rec := containerizer.Record{RuntimeID: created.ID}
	if spec.Stdout != nil || spec.Stderr != nil {
		att, err := r.cli.ContainerAttach(ctx, created.ID, client.ContainerAttachOptions{Stream: true, Stdout: true, Stderr: true})
		if err != nil {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
			defer cancel()
			r.cli.ContainerRemove(cctx, created.ID, client.ContainerRemoveOptions{Force: true})
			return containerizer.Record{}, daemonErr("attach container", err)
		}
		st := &stream{att: att.HijackedResponse, done: make(chan struct{})}
		r.mu.Lock()
		r.streams[created.ID] = st
		r.mu.Unlock()
		go copyOutput(att.HijackedResponse, spec.Stdout, spec.Stderr, st.done)
	}
	return rec, nil
}

// networkMode is Docker's network mode for n, checked by Image: the zero
// NetworkPrivate is Docker's "none", a namespace of the container's own
// with only a loopback interface, as a native container's; never the
// daemon's default bridge.
func networkMode(n containerizer.Network) container.NetworkMode {
	if n == containerizer.NetworkPrivate {
		return container.NetworkMode(containerizer.NetworkNone)
	}
	return container.NetworkMode(n)
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

// Start starts a created container.
func (r *Runtime) Start(ctx context.Context, rec containerizer.Record) error {
	if _, err := r.cli.ContainerStart(ctx, rec.RuntimeID, client.ContainerStartOptions{}); err != nil {
		return daemonErr("start container", err)
	}
	return nil
}

// Wait blocks until the container is no longer running and its output is
// copied, and returns its exit status (128+N for signal N).
func (r *Runtime) Wait(ctx context.Context, rec containerizer.Record) (containerizer.ExitStatus, error) {
	r.mu.Lock()
	st := r.streams[rec.RuntimeID]
	r.mu.Unlock()
	res := r.cli.ContainerWait(ctx, rec.RuntimeID, client.ContainerWaitOptions{Condition: container.WaitConditionNotRunning})
	var status containerizer.ExitStatus
	select {
	case w := <-res.Result:
		if w.Error != nil && w.Error.Message != "" {
			return status, fmt.Errorf("%s", w.Error.Message)
		}
		status.Code = int(w.StatusCode)
	case err := <-res.Error:
		return status, daemonErr("wait container", err)
	}
	if st != nil {
		select {
		case <-st.done:
		case <-ctx.Done():
			return status, fmt.Errorf("output: %w", ctx.Err())
		}
	}
	return status, nil
}

// Kill stops the container: SIGTERM, then SIGKILL after the stop timeout
// (WithStopTimeout).
func (r *Runtime) Kill(ctx context.Context, rec containerizer.Record) error {
	secs := int(r.cfg.stopTimeout / time.Second)
	_, err := r.cli.ContainerStop(ctx, rec.RuntimeID, client.ContainerStopOptions{Timeout: &secs})
	if err != nil && !cerrdefs.IsNotFound(err) {
		return daemonErr("stop container", err)
	}
	return nil
}

// Remove force-removes the container and lets go of its output.
func (r *Runtime) Remove(ctx context.Context, rec containerizer.Record) error {
	_, err := r.cli.ContainerRemove(ctx, rec.RuntimeID, client.ContainerRemoveOptions{Force: true})
	if err != nil && !cerrdefs.IsNotFound(err) {
		return daemonErr("remove container", err)
	}
	r.mu.Lock()
	st := r.streams[rec.RuntimeID]
	delete(r.streams, rec.RuntimeID)
	r.mu.Unlock()
	if st != nil {
		select {
		case <-st.done:
		default:
			st.att.Close() // a container that never started sends nothing
		}
	}
	return nil
}

// List returns the records of the namespace's containers, from their
// labels; one whose labels do not parse comes with Err (matching
// ErrNotManaged). A container not running is inspected for its exit
// status.
func (r *Runtime) List(ctx context.Context) ([]containerizer.Record, error) {
	list, err := r.cli.ContainerList(ctx, client.ContainerListOptions{
		All:     true,
		Filters: make(client.Filters).Add("label", LabelNamespace+"="+r.cfg.namespace),
	})
	if err != nil {
		return nil, daemonErr("list containers", err)
	}
	var out []containerizer.Record
	for _, s := range list.Items {
		rec := containerizer.Record{RuntimeID: s.ID, ID: s.Labels[dockerconfig.LabelOwner]}
		if h, ok := parseSupervisor(s.Labels[LabelSupervisor]); ok {
			rec.Supervisor = &h
		}
		owner, gpus, err := dockerconfig.ParseLabels(s.Labels)
		if err != nil {
			rec.Err = fmt.Errorf("%w: %w", ErrNotManaged, err)
			out = append(out, rec)
			continue
		}
		rec.ID, rec.GPUs = owner, gpus
		if v := s.Labels[LabelShare]; v != "" {
			var sh allocator.Share
			if err := json.Unmarshal([]byte(v), &sh); err != nil || sh.Validate() != nil {
				rec.Err = fmt.Errorf("%w: label %s=%q: not a share", ErrNotManaged, LabelShare, v)
				out = append(out, rec)
				continue
			}
			rec.Share = &sh
		}
		if v := s.Labels[LabelVolume]; v != "" && r.cfg.volumes != nil {
			rec.VolumeVersion, rec.Volume = v, filepath.Join(r.cfg.volumes.Root(), volume.Prefix+v)
		}
		switch s.State {
		case container.StateRunning, container.StatePaused, container.StateRestarting:
		default:
			insp, err := r.cli.ContainerInspect(ctx, s.ID, client.ContainerInspectOptions{})
			if err != nil {
				if cerrdefs.IsNotFound(err) {
					continue // removed meanwhile
				}
				return nil, daemonErr("inspect container", err)
			}
			if st := insp.Container.State; st != nil && !st.Running {
				rec.Exit = &containerizer.ExitStatus{Code: st.ExitCode}
			}
		}
		out = append(out, rec)
	}
	return out, nil
}
