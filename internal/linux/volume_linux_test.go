package linux

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestLockExcludes(t *testing.T) {
	p := filepath.Join(t.TempDir(), "lock")
	a, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := context.Background()
	if err := Lock(ctx, a); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if err := Lock(short, b); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second Lock while held = %v, want context.DeadlineExceeded", err)
	}
	done := make(chan error, 1)
	go func() { done <- Lock(ctx, b) }()
	if err := Unlock(a); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Lock after Unlock = %v", err)
	}
}

func TestExchange(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	if err := os.WriteFile(a, []byte("a"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(b, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := Exchange(a, b); err != nil {
		if errors.Is(err, ErrNotSupported) {
			t.Skipf("file system of %s: %v", dir, err)
		}
		t.Fatal(err)
	}
	if fi, err := os.Stat(a); err != nil || !fi.IsDir() {
		t.Fatalf("after Exchange, %s is %v, %v; want the directory", a, fi, err)
	}
	if got, err := os.ReadFile(b); err != nil || string(got) != "a" {
		t.Fatalf("after Exchange, %s holds %q, %v", b, got, err)
	}
}

func TestNoexecAndOwner(t *testing.T) {
	dir := t.TempDir()
	if _, err := Noexec(dir); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if uid, ok := Owner(fi); !ok || int(uid) != os.Geteuid() {
		t.Fatalf("Owner(%s) = %d, %v; want %d", dir, uid, ok, os.Geteuid())
	}
}
