package main

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
)

// TestPodman runs images with podman run --runtime gpuiso-runtime on a
// simulated 8-GPU node: each container sees exactly the GPUs it asked for
// in NVIDIA_VISIBLE_DEVICES, nodes it makes for the others are denied, and
// the driver volume is there read-only where the request asks for it, or
// the com.nvidia.volumes.needed annotation does.
func TestPodman(t *testing.T) {
	podman := testenv.RequirePodman(t)
	testenv.RequireNVIDIALibraries(t)
	bin := buildRuntime(t)
	sim, major, gpus := simNode(t, "dgx1-volta")
	img := testenv.BuildPodmanProbeImage(t, podman)
	cases := append(slices.Clone(isolationCases), struct {
		name string
		env  string
		want Expect
	}{name: "volume label", want: Expect{Control: true, Volume: true}})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			// Podman's default capabilities lack CAP_MKNOD; with it, the
			// device cgroup alone must deny the self-made nodes.
			args := append([]string{"run", "--rm", "--network", "none", "--cap-add", "MKNOD", "--runtime", bin,
				"--runtime-flag", "simulate=dgx1-volta", "--runtime-flag", "dev-root=" + sim}, testenv.PodmanRunFlags...)
			if tc.env != "" {
				args = append(args, "-e", "NVIDIA_VISIBLE_DEVICES="+tc.env)
			}
			if tc.name == "volume label" {
				// What an image's label says, as an annotation of the
				// spec: the driver, no GPU.
				args = append(args, "--annotation", "com.nvidia.volumes.needed=nvidia_driver")
			}
			out, err := testenv.RunPodman(ctx, podman, append(append(args, img), probeArgs(major, gpus)...)...)
			if err != nil {
				t.Fatal(err)
			}
			checkIsolation(t, out, gpus, tc.want)
		})
	}
}

// TestPodmanRefused: a request gpuiso-runtime refuses (a GPU the node does
// not have, a driver the image's requirements refuse) fails podman run with
// gpuiso-runtime's line, and runc created nothing.
func TestPodmanRefused(t *testing.T) {
	podman := testenv.RequirePodman(t)
	bin := buildRuntime(t)
	sim, _, _ := simNode(t, "dgx1-volta")
	img := testenv.BuildPodmanProbeImage(t, podman)
	for _, tc := range []struct {
		name string
		env  []string
		want string
	}{
		{name: "no such GPU", env: []string{"NVIDIA_VISIBLE_DEVICES=9"}, want: "unknown device"},
		{name: "requirement", env: []string{"NVIDIA_VISIBLE_DEVICES=1", "NVIDIA_REQUIRE_CUDA=cuda>=99.0"}, want: "cuda>=99.0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			name := fmt.Sprintf("gpuiso-refused-%d", time.Now().UnixNano())
			args := append([]string{"run", "--name", name, "--network", "none", "--runtime", bin,
				"--runtime-flag", "simulate=dgx1-volta", "--runtime-flag", "dev-root=" + sim}, testenv.PodmanRunFlags...)
			for _, e := range tc.env {
				args = append(args, "-e", e)
			}
			t.Cleanup(func() { testenv.RunPodman(context.Background(), podman, "rm", "-f", name) })
			out, err := testenv.RunPodman(ctx, podman, append(args, img, "exit")...)
			if err == nil || !strings.Contains(out, "gpuiso-runtime: container ") || !strings.Contains(out, tc.want) {
				t.Fatalf("podman run: %v\n%s", err, out)
			}
			if id, err := testenv.RunPodman(ctx, podman, "inspect", "--format", "{{.Id}}", name); err == nil {
				if out, err := exec.Command("runc", "--root", "/run/runc", "state", strings.TrimSpace(id)).CombinedOutput(); err == nil {
					t.Errorf("runc has the refused container: %s", out)
				}
			}
		})
	}
}
