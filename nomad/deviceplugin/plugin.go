package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/simnode"
	"github.com/gpuiso/gpuiso/nomad/internal/proto/base"
	"github.com/gpuiso/gpuiso/nomad/internal/proto/device"
)

// The plugin's identity, as PluginInfo reports it and Nomad's plugin
// block names it.
const (
	// Name is the plugin's name: the label of its plugin block.
	Name = "gpuiso"
	// APIVersion is the device plugin API version the plugin speaks.
	APIVersion = "v0.1.0"
	// Version is the plugin's own version.
	Version = "0.1.0"
	// Vendor and DeviceType make the devices' "nvidia/gpu" in a job's
	// device block.
	Vendor     = "nvidia"
	DeviceType = "gpu"
)

// Plugin is the device plugin: it answers Nomad's base and device calls.
// It is made with New, configured by SetConfig, and stopped with Close.
// It is safe for concurrent use.
type Plugin struct {
	base.UnimplementedBasePluginServer
	device.UnimplementedDevicePluginServer

	log *slog.Logger
	sim *simnode.Node // answers for a simulate key that names its topology

	mu     sync.Mutex
	st     *state        // the configuration in force, nil before one took
	wake   chan struct{} // closed and replaced on every change streams show
	closed bool
}

// Option configures New.
type Option func(*Plugin) error

// WithLogger makes the plugin log to l (default: nowhere).
func WithLogger(l *slog.Logger) Option {
	return func(p *Plugin) error {
		if l == nil {
			return fmt.Errorf("%w: nil logger", node.ErrInvalid)
		}
		p.log = l
		return nil
	}
}

// WithSimulatedNode makes a configuration whose simulate key names n's
// topology use n itself rather than a node of its own, so that the caller
// drives it (InjectXID, Lose).
func WithSimulatedNode(n *simnode.Node) Option {
	return func(p *Plugin) error {
		if n == nil {
			return fmt.Errorf("%w: nil simulated node", node.ErrInvalid)
		}
		p.sim = n
		return nil
	}
}

// New returns an unconfigured plugin.
func New(opts ...Option) (*Plugin, error) {
	p := &Plugin{log: slog.New(slog.NewTextHandler(io.Discard, nil)), wake: make(chan struct{})}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: nil option", node.ErrInvalid)
		}
		if err := o(p); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// Close stops the plugin's watchers and lets go of the allocator's state
// directory. The holds it made stay in the state, for the next plugin to
// give back.
func (p *Plugin) Close() error {
	p.mu.Lock()
	st := p.st
	p.st, p.closed = nil, true
	p.notifyLocked()
	p.mu.Unlock()
	if st != nil {
		return st.close()
	}
	return nil
}

// current returns the configuration in force and the channel closed on the
// next change.
func (p *Plugin) current() (*state, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.st, p.wake
}

// notify wakes the streams.
func (p *Plugin) notify() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.notifyLocked()
}

func (p *Plugin) notifyLocked() {
	close(p.wake)
	p.wake = make(chan struct{})
}

// PluginInfo says what the plugin is: a device plugin of API v0.1.0.
func (p *Plugin) PluginInfo(context.Context, *base.PluginInfoRequest) (*base.PluginInfoResponse, error) {
	return &base.PluginInfoResponse{
		Type:              base.PluginType_DEVICE,
		PluginApiVersions: []string{APIVersion},
		PluginVersion:     Version,
		Name:              Name,
	}, nil
}

// ConfigSchema returns the plugin block's schema (Spec).
func (p *Plugin) ConfigSchema(context.Context, *base.ConfigSchemaRequest) (*base.ConfigSchemaResponse, error) {
	return &base.ConfigSchemaResponse{Spec: Spec()}, nil
}

// SetConfig checks the configuration, opens the node it describes (the
// GPUs, the allocator's state, the driver volume) and puts it in force.
// Anything refused leaves the configuration in force as it was.
func (p *Plugin) SetConfig(ctx context.Context, req *base.SetConfigRequest) (*base.SetConfigResponse, error) {
	if v := req.GetPluginApiVersion(); v != "" && v != APIVersion {
		return nil, grpcError(fmt.Errorf("%w: %q (this plugin speaks %s)", ErrAPIVersion, v, APIVersion))
	}
	cfg, err := DecodeConfig(req.GetMsgpackConfig())
	if err != nil {
		return nil, grpcError(err)
	}
	if err := p.Configure(ctx, cfg); err != nil {
		return nil, grpcError(err)
	}
	return &base.SetConfigResponse{}, nil
}

// Configure puts cfg in force, as SetConfig does with a decoded block.
func (p *Plugin) Configure(ctx context.Context, cfg Config) error {
	st, err := open(ctx, cfg, p.sim, p.log, p.notify)
	if err != nil {
		return fmt.Errorf("configure: %w", err)
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return errors.Join(fmt.Errorf("configure: %w", ErrNotConfigured), st.close())
	}
	old := p.st
	p.st = st
	p.notifyLocked()
	p.mu.Unlock()
	if old != nil {
		if err := old.close(); err != nil {
			p.log.Warn("closing the previous configuration", "err", err)
		}
	}
	return nil
}

// grpcError gives err the status code its kind calls for, its text as the
// message.
func grpcError(err error) error {
	code := codes.Internal
	switch {
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	case errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	case errors.Is(err, node.ErrInvalid):
		code = codes.InvalidArgument
	case errors.Is(err, node.ErrNotFound):
		code = codes.NotFound
	case errors.Is(err, node.ErrExists):
		code = codes.AlreadyExists
	case errors.Is(err, node.ErrNotSupported):
		code = codes.Unimplemented
	case errors.Is(err, node.ErrUnavailable), errors.Is(err, node.ErrInsufficient):
		code = codes.FailedPrecondition
	}
	return status.Error(code, err.Error())
}
