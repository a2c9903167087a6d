package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/gpuiso/gpuiso/internal/cli"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
)

// openNode discovers the node gpuiso-runtime runs on: the host's, or the
// simulated node s names, whose host tree under s.DevRoot is made on first
// use (under a lock, so that concurrent calls make it once) and kept, so
// that every call sees the same device nodes. It returns the inventory and
// the directory holding the node's device nodes.
func openNode(ctx context.Context, s Settings) (*node.Inventory, string, error) {
	if s.Simulate == "" {
		inv, err := nvmlnode.Discover(ctx)
		if err != nil {
			return nil, "", errors.New(cli.ExplainDiscover(err))
		}
		return inv, node.DefaultDevRoot, nil
	}
	sim, err := simnode.New(s.Simulate)
	if err != nil {
		return nil, "", err
	}
	root, err := filepath.Abs(s.DevRoot)
	if err != nil {
		return nil, "", err
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, "", fmt.Errorf("simulated node: %w", err)
	}
	host := &simnode.Host{Root: root, DevRoot: filepath.Join(root, "dev"), ProcRoot: filepath.Join(root, "proc"), SysRoot: filepath.Join(root, "sys")}
	if err := withLock(filepath.Join(root, ".lock"), func() error {
		if _, err := os.Stat(filepath.Join(host.ProcRoot, "devices")); err == nil {
			return nil // made by an earlier call
		}
		h, err := sim.MakeHost(root)
		if err != nil {
			return fmt.Errorf("simulated node (needs root): %w", err)
		}
		host = h
		return nil
	}); err != nil {
		return nil, "", err
	}
	inv, err := nvmlnode.Discover(ctx, sim.DiscoverOptions(host)...)
	if err != nil {
		return nil, "", err
	}
	return inv, host.DevRoot, nil
}

// withLock runs fn holding an exclusive flock on path.
func withLock(path string, fn func() error) error {
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("lock %s: %w", path, err)
	}
	return fn()
}
