package docker

import (
	"context"
	"log/slog"

	"github.com/moby/moby/client"

	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/isolator/cdi"
	"github.com/gpuiso/gpuiso/isolator/dockerconfig"
)

// DaemonInfo is what the containerizer asks a daemon to decide between CDI
// and device mappings; *client.Client has it. A Client without it gets
// device mappings.
type DaemonInfo interface {
	ServerVersion(ctx context.Context, opts client.ServerVersionOptions) (client.ServerVersionResult, error)
	Info(ctx context.Context, opts client.InfoOptions) (client.SystemInfoResult, error)
}

var _ DaemonInfo = (*client.Client)(nil)

// WithCDI makes the containerizer hand GPUs to a daemon that speaks CDI
// (API 1.44 or later with CDI enabled: Docker 25+) as CDI device requests
// of kind (e.g. cdi.DefaultKind), whose spec the node keeps written (see
// isolator/cdi); other daemons get device mappings as without it. The
// choice is made once, at the first launch, and recorded on every
// container in dockerconfig.LabelInjection.
func WithCDI(kind string) Option {
	return func(c *config) error {
		if err := cdi.ValidateKind(kind); err != nil {
			return err
		}
		c.cdiKind = kind
		return nil
	}
}

// dockerConfig is the Docker configuration of plan: CDI requests where
// WithCDI was given and the daemon takes them, device mappings otherwise.
func (r *Runtime) dockerConfig(ctx context.Context, plan *isolator.Plan) (*dockerconfig.Config, error) {
	if r.cfg.cdiKind == "" || !r.daemonCDI(ctx) {
		return dockerconfig.New(plan)
	}
	return dockerconfig.NewCDI(plan, r.cfg.cdiKind)
}

// daemonCDI reports whether the daemon takes CDI device requests, asking it
// once; a daemon that cannot be asked now is asked again next time.
func (r *Runtime) daemonCDI(ctx context.Context) bool {
	r.mu.Lock()
	ok, known := r.cdi, r.cdiKnown
	r.mu.Unlock()
	if known {
		return ok
	}
	di, isInfo := r.cli.(DaemonInfo)
	if !isInfo {
		return false
	}
	ver, err := di.ServerVersion(ctx, client.ServerVersionOptions{})
	if err != nil {
		r.cfg.logger.Debug("daemon version for CDI", slog.Any("err", err))
		return false
	}
	info, err := di.Info(ctx, client.InfoOptions{})
	if err != nil {
		r.cfg.logger.Debug("daemon info for CDI", slog.Any("err", err))
		return false
	}
	ok = dockerconfig.CDISupported(ver.APIVersion, info.Info.CDISpecDirs)
	r.cfg.logger.Info("GPU injection", slog.String("api", ver.APIVersion), slog.Any("cdiSpecDirs", info.Info.CDISpecDirs), slog.Bool("cdi", ok))
	r.mu.Lock()
	r.cdi, r.cdiKnown = ok, true
	r.mu.Unlock()
	return ok
}
