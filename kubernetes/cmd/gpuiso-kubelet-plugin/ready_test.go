package main

import (
	"bytes"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// TestReady: the ready file is written once the kubelet registered the
// plugin, never before; --is-ready answers 1 before and 0 after.
func TestReady(t *testing.T) {
	path := filepath.Join(t.TempDir(), "run", "ready")
	if code := run(t.Context(), []string{"--is-ready", path}, io.Discard); code != 1 {
		t.Fatalf("--is-ready before: %d, want 1", code)
	}
	var registered atomic.Bool
	readyWhen(t.Context(), path, registered.Load, slog.New(slog.DiscardHandler))
	time.Sleep(300 * time.Millisecond)
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("the ready file before the registration: %v", err)
	}
	registered.Store(true)
	deadline := time.Now().Add(10 * time.Second)
	for isReady(path, io.Discard) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("no ready file after the registration")
		}
		time.Sleep(20 * time.Millisecond)
	}
	var out bytes.Buffer
	if code := run(t.Context(), []string{"--is-ready", path}, &out); code != 0 {
		t.Errorf("--is-ready after: %d (%s), want 0", code, out.String())
	}
}
