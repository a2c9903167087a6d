package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
)

// gpuisoDockerd starts a Docker daemon beside the host's whose runtime
// "gpuiso" is bin with args, and returns it with a probe image built there.
func gpuisoDockerd(t *testing.T, bin string, config map[string]any, args ...string) (*testenv.Dockerd, string) {
	t.Helper()
	if config == nil {
		config = map[string]any{}
	}
	config["runtimes"] = map[string]any{"gpuiso": map[string]any{"path": bin, "runtimeArgs": args}}
	d := testenv.StartDockerd(t, config)
	return d, testenv.BuildProbeImage(t, d.Client, testenv.ProbeImage{})
}

// TestDocker runs images with docker run --runtime gpuiso on a simulated
// 8-GPU node, through a Docker daemon started for the test: each container
// sees exactly the GPUs named in NVIDIA_VISIBLE_DEVICES, nodes it makes for
// the others are denied, the driver volume is read-only where asked for;
// a request for a GPU the node lacks fails docker run with gpuiso-runtime's
// reason.
func TestDocker(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireNVIDIALibraries(t)
	bin := buildRuntime(t)
	sim, major, gpus := simNode(t, "dgx1-volta")
	d, img := gpuisoDockerd(t, bin, nil, "--simulate", "dgx1-volta", "--dev-root", sim)
	for _, tc := range isolationCases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			args := []string{"run", "--rm", "--network", "none", "--runtime", "gpuiso"}
			if tc.env != "" {
				args = append(args, "-e", "NVIDIA_VISIBLE_DEVICES="+tc.env)
			}
			out, err := d.Docker(ctx, append(append(args, img), probeArgs(major, gpus)...)...)
			if err != nil {
				t.Fatal(err)
			}
			checkIsolation(t, out, gpus, tc.want)
		})
	}
	t.Run("refused", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		out, err := d.Docker(ctx, "run", "--rm", "--network", "none", "--runtime", "gpuiso", "-e", "NVIDIA_VISIBLE_DEVICES=9", img, "exit")
		if err == nil || !strings.Contains(out, "OCI runtime create failed: container ") || !strings.Contains(out, "unknown device") {
			t.Fatalf("docker run of GPU 9 on an 8-GPU node: %v\n%s", err, out)
		}
	})
}
