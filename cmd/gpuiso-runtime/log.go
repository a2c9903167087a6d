package main

import (
	"io"
	"log/slog"
	"os"
	"strings"
	"time"
)

// logFile is the --log file, written in runc's format so that the callers
// that read runc's log for its last error (containerd's shim) read ours.
type logFile struct {
	*slog.Logger
	f *os.File
}

// newLogger opens s.Log for appending (nothing is logged without one).
func newLogger(s Settings) *logFile {
	if s.Log == "" {
		return &logFile{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	}
	f, err := os.OpenFile(s.Log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return &logFile{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	}
	return &logFile{Logger: slog.New(runcHandler(f, s.LogFormat)), f: f}
}

// runcHandler writes records as runc does: lower-case levels, RFC 3339
// times, "msg" for the message; JSON lines or logfmt text.
func runcHandler(w io.Writer, format string) slog.Handler {
	opts := &slog.HandlerOptions{
		Level: slog.LevelDebug,
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			switch {
			case len(groups) > 0:
			case a.Key == slog.LevelKey:
				a.Value = slog.StringValue(strings.ToLower(a.Value.String()))
			case a.Key == slog.TimeKey:
				a.Value = slog.StringValue(a.Value.Time().Format(time.RFC3339Nano))
			}
			return a
		},
	}
	if format == "json" {
		return slog.NewJSONHandler(w, opts)
	}
	return slog.NewTextHandler(w, opts)
}

// Close closes the file.
func (l *logFile) Close() error {
	if l.f == nil {
		return nil
	}
	return l.f.Close()
}
