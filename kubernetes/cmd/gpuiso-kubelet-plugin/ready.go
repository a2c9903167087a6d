package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"
)

// readyWhen writes the file path (--ready-file) once registered() tells
// that the kubelet registered the plugin, checking every 100 ms until ctx
// ends: a DaemonSet's readiness probe (--is-ready) then keeps a surging
// roll from removing the instance this one replaces before the kubelet can
// call this one. An empty path writes nothing.
func readyWhen(ctx context.Context, path string, registered func() bool, log *slog.Logger) {
	if path == "" {
		return
	}
	go func() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for !registered() {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
		err := os.MkdirAll(filepath.Dir(path), 0o700)
		if err == nil {
			err = os.WriteFile(path, []byte("registered\n"), 0o600)
		}
		if err != nil {
			log.Warn("write the ready file", "file", path, "err", err)
			return
		}
		log.Info("registered with the kubelet: ready", "file", path)
	}()
}

// isReady is the program run as a readiness probe (--is-ready FILE): exit
// status 0 when the serving instance wrote FILE, 1 when not yet.
func isReady(path string, stderr io.Writer) int {
	if _, err := os.Stat(path); err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			fmt.Fprintln(stderr, "gpuiso-kubelet-plugin:", err)
		}
		return 1
	}
	return 0
}
