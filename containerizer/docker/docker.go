package docker

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"time"

	"github.com/moby/moby/client"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/isolator/mps"
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
	// LabelShare holds the share of its one GPU the container holds
	// (allocator.Share as JSON), when it holds one.
	LabelShare = "io.gpuiso.share"
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
	volumes     *volume.Manager
	namespace   string
	stopTimeout time.Duration
	logger      *slog.Logger
	cdiKind     string // WithCDI; "" for device mappings always
	labels      map[string]string
	supervisor  *allocator.Holder // WithSupervisor
	mps         *mps.Manager      // WithMPS
}

// WithVolumes gives the containerizer the driver volume manager; without
// it, images that need the volume are refused with ErrNoVolume.
func WithVolumes(m *volume.Manager) Option {
	return func(c *config) error {
		c.volumes = m
		return nil
	}
}

// WithMPS gives the containerizer the MPS daemon manager that enforces
// memory shares (package isolator/mps); without it, memory shares are
// refused with containerizer.ErrNoMPS. A memory share's container gets its
// daemon's pipe directory and /dev/shm as bind mounts.
func WithMPS(m *mps.Manager) Option {
	return func(c *config) error {
		c.mps = m
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
// documentation): a containerizer.Lifecycle over a Docker Runtime. It is
// safe for concurrent use.
type Containerizer struct {
	*containerizer.Lifecycle
	rt *Runtime
}

var _ containerizer.Containerizer = (*Containerizer)(nil)

// New returns a containerizer that runs containers on the daemon cli talks
// to, with GPUs of alloc, on the node alloc was made for
// (Allocator.Inventory): a containerizer.Lifecycle over one Runtime. For
// Docker containers beside others (native ones) under one Lifecycle and
// one allocator, give NewRuntime's Runtime to containerizer.NewLifecycle
// with the others.
func New(cli Client, alloc *allocator.Allocator, opts ...Option) (*Containerizer, error) {
	if cli == nil || alloc == nil {
		return nil, fmt.Errorf("docker containerizer: nil client or allocator: %w", node.ErrInvalid)
	}
	rt, err := NewRuntime(cli, opts...)
	if err != nil {
		return nil, err
	}
	lc, err := containerizer.NewLifecycle(containerizer.LifecycleConfig{
		Runtime: rt, Allocator: alloc, Volumes: rt.cfg.volumes, MPS: rt.cfg.mps, Logger: rt.cfg.logger,
	})
	if err != nil {
		return nil, fmt.Errorf("docker containerizer: %w", err)
	}
	return &Containerizer{Lifecycle: lc, rt: rt}, nil
}

// Namespace returns the containerizer's namespace (see WithNamespace).
func (z *Containerizer) Namespace() string {
	if z.rt == nil {
		return ""
	}
	return z.rt.cfg.namespace
}
