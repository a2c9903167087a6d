package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
)

// TestContainerd runs containers with ctr through a containerd started for
// the test, whose runc shim is given gpuiso-runtime as its runc binary
// (--runc-binary: the shim's BinaryName option, what a runtime entry of
// containerd's configuration sets): each container sees exactly the GPUs
// named in NVIDIA_VISIBLE_DEVICES, the others' self-made nodes are denied,
// the driver volume is read-only where asked for.
func TestContainerd(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireNVIDIALibraries(t)
	bin := buildRuntime(t)
	sim, major, gpus := simNode(t, "dgx1-volta")
	c := testenv.StartContainerd(t)
	// The shim runs its runc binary with no arguments of ours: a wrapper
	// carries the simulated node's flags. containerd keeps no record of an
	// image beside the bundle (and ctr --rootfs has none): the operator
	// trusts the environment of the containers it runs.
	dir := t.TempDir()
	wrapper := filepath.Join(dir, "gpuiso-runtime-sim")
	script := fmt.Sprintf("#!/bin/sh\nexec %q --simulate dgx1-volta --dev-root %q --accept-env-request always \"$@\"\n", bin, sim)
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	probe, err := os.ReadFile(testenv.BuildProbe(t))
	if err != nil {
		t.Fatal(err)
	}
	// newRootfs is a root file system holding the probe: one for each
	// container, as runc makes mount points (the volume's) in it.
	newRootfs := func(t *testing.T) string {
		rootfs := filepath.Join(t.TempDir(), "rootfs")
		if err := os.MkdirAll(rootfs, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(rootfs, "probe"), probe, 0o755); err != nil {
			t.Fatal(err)
		}
		return rootfs
	}
	for i, tc := range isolationCases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			args := []string{"run", "--rm", "--runc-binary", wrapper}
			if tc.env != "" {
				args = append(args, "--env", "NVIDIA_VISIBLE_DEVICES="+tc.env)
			}
			args = append(args, "--rootfs", newRootfs(t), fmt.Sprintf("gpuiso-ctr-%d-%d", i, time.Now().UnixNano()), "/probe")
			out, err := c.Ctr(ctx, append(args, probeArgs(major, gpus)...)...)
			if err != nil {
				t.Fatal(err)
			}
			checkIsolation(t, out, gpus, tc.want)
		})
	}
}
