package nri

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/containerd/nri/pkg/stub"
)

// Name and Index are how the plugin registers with the runtime: NRI calls
// plugins in the order of their indexes.
const (
	Name  = "gpuiso"
	Index = "50"
)

// Serve connects p to the runtime's NRI socket and serves it until ctx
// ends, connecting again (after one second, then up to ten) whenever the
// runtime restarts or is not there yet. log, when not nil, is told of each
// connection lost; the NRI library's own messages go to it at debug level.
func Serve(ctx context.Context, socket string, p *Plugin, log *slog.Logger) error {
	wait := time.Second
	for {
		began := time.Now()
		err := serveOnce(ctx, socket, p, log)
		if ctx.Err() != nil {
			return nil
		}
		if time.Since(began) > time.Minute {
			wait = time.Second // it was connected: the runtime restarted
		}
		if log != nil {
			log.Warn("NRI: not connected to the runtime", "socket", socket, "err", err, "again in", wait)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		wait = min(2*wait, 10*time.Second)
	}
}

func serveOnce(ctx context.Context, socket string, p *Plugin, log *slog.Logger) error {
	s, err := stub.New(p, stub.WithPluginName(Name), stub.WithPluginIdx(Index), stub.WithSocketPath(socket),
		stub.WithLogger(logger{log}))
	if err != nil {
		return fmt.Errorf("NRI plugin: %w", err)
	}
	if err := s.Start(ctx); err != nil {
		return fmt.Errorf("NRI plugin: %w", err)
	}
	if log != nil {
		log.Info("NRI: serving the runtime", "socket", socket, "plugin", Index+"-"+Name)
	}
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-ctx.Done():
			s.Stop()
		case <-done:
		}
	}()
	s.Wait()
	return errors.New("NRI plugin: the runtime closed the connection")
}

// logger passes the NRI library's messages to a slog.Logger at debug level
// (its warnings and errors at theirs), or drops them without one.
type logger struct{ l *slog.Logger }

func (g logger) logf(ctx context.Context, level slog.Level, format string, args ...any) {
	if g.l != nil {
		g.l.Log(ctx, level, "NRI: "+fmt.Sprintf(format, args...))
	}
}

func (g logger) Debugf(ctx context.Context, format string, args ...any) {
	g.logf(ctx, slog.LevelDebug, format, args...)
}

func (g logger) Infof(ctx context.Context, format string, args ...any) {
	g.logf(ctx, slog.LevelDebug, format, args...)
}

func (g logger) Warnf(ctx context.Context, format string, args ...any) {
	g.logf(ctx, slog.LevelWarn, format, args...)
}

func (g logger) Errorf(ctx context.Context, format string, args ...any) {
	g.logf(ctx, slog.LevelError, format, args...)
}
