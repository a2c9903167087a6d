package main

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/opencontainers/runtime-spec/specs-go"
)

// TestImageEnvironmentForms plays, for each engine, every form an image's
// own environment can take against the container's environment as that
// engine writes it into the spec: only what the caller set asks.
//
//   - Podman trims spaces and tabs from the front of an image's names (not
//     from their end), keeps the last entry of a name, and fills an entry
//     without "=" ("NAME", "PREFIX*") from its caller's environment: such
//     an entry makes the variable the image's, whatever its value.
//   - Docker keeps an image's entries byte for byte, after the caller's
//     names, and drops an entry without "=".
//   - containerd keeps no record of the image: under the default policy
//     nothing of the environment asks; under "always" the spec's exact
//     names do.
//
// DOCKER_RESOURCE_* (Swarm's GPUs, and its slice resource,
// DOCKER_RESOURCE_NVIDIA-GPU-SLICE, in every form) asks only in a Docker
// Swarm task, with a value not the image's.
func TestImageEnvironmentForms(t *testing.T) {
	const kind = "nvidia.com/gpu"
	type row struct {
		name    string
		image   []string // the image's Env
		spec    []string // the container's, as the engine writes it
		policy  AcceptEnv
		task    bool // a Docker Swarm task
		want    []string
		share   bool
		ignored string // in Ignored
	}
	engines := map[string][]row{
		"podman": {
			{name: "leading space", image: []string{" NVIDIA_VISIBLE_DEVICES=0,1"}, spec: []string{"NVIDIA_VISIBLE_DEVICES=0,1"}, ignored: "the image's own setting"},
			{name: "leading tab", image: []string{"\tNVIDIA_VISIBLE_DEVICES=0"}, spec: []string{"NVIDIA_VISIBLE_DEVICES=0"}, ignored: "the image's own setting"},
			{name: "spaces and tabs", image: []string{" \t \tNVIDIA_VISIBLE_DEVICES=all"}, spec: []string{"NVIDIA_VISIBLE_DEVICES=all"}, ignored: "the image's own setting"},
			{name: "leading space, caller's value", image: []string{" NVIDIA_VISIBLE_DEVICES=0,1"}, spec: []string{"NVIDIA_VISIBLE_DEVICES=1"}, want: []string{"1"}},
			{name: "trailing space is another name", image: []string{"NVIDIA_VISIBLE_DEVICES =0,1"}, spec: []string{"NVIDIA_VISIBLE_DEVICES =0,1"}},
			{name: "trailing space, caller's value", image: []string{"NVIDIA_VISIBLE_DEVICES =1"}, spec: []string{"NVIDIA_VISIBLE_DEVICES =1", "NVIDIA_VISIBLE_DEVICES=1"}, want: []string{"1"}},
			{name: "value's spaces kept", image: []string{"NVIDIA_VISIBLE_DEVICES= 0,1 "}, spec: []string{"NVIDIA_VISIBLE_DEVICES= 0,1 "}, ignored: "the image's own setting"},
			{name: "key only", image: []string{"NVIDIA_VISIBLE_DEVICES"}, spec: []string{"NVIDIA_VISIBLE_DEVICES=0"}, ignored: "without a value, which podman fills from its caller's environment"},
			{name: "key only after a tab", image: []string{"\tNVIDIA_VISIBLE_DEVICES"}, spec: []string{"NVIDIA_VISIBLE_DEVICES=1"}, ignored: "without a value"},
			{name: "key only, any value", image: []string{"PATH=/bin", "NVIDIA_VISIBLE_DEVICES"}, spec: []string{"PATH=/bin", "NVIDIA_VISIBLE_DEVICES=3"}, ignored: "without a value"},
			{name: "prefix", image: []string{"NVIDIA_*"}, spec: []string{"NVIDIA_VISIBLE_DEVICES=0"}, ignored: "without a value"},
			{name: "prefix of the whole name", image: []string{"NVIDIA_VISIBLE_DEVICES*"}, spec: []string{"NVIDIA_VISIBLE_DEVICES=0"}, ignored: "without a value"},
			{name: "every variable", image: []string{" *"}, spec: []string{"NVIDIA_VISIBLE_DEVICES=0"}, ignored: "without a value"},
			{name: "another prefix", image: []string{"CUDA_*"}, spec: []string{"NVIDIA_VISIBLE_DEVICES=2"}, want: []string{"2"}},
			{name: "a star with a value is a name", image: []string{"NVIDIA_*=x"}, spec: []string{"NVIDIA_*=x", "NVIDIA_VISIBLE_DEVICES=2"}, want: []string{"2"}},
			{name: "key only, then a value", image: []string{"NVIDIA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES=all"}, spec: []string{"NVIDIA_VISIBLE_DEVICES=all"}, ignored: "the image's own setting"},
			{name: "key only, then a value, caller's value", image: []string{"NVIDIA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES=all"}, spec: []string{"NVIDIA_VISIBLE_DEVICES=1"}, want: []string{"1"}},
			{name: "a value, then key only", image: []string{"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES"}, spec: []string{"NVIDIA_VISIBLE_DEVICES=1"}, ignored: "without a value"},
			{name: "duplicates, the last wins", image: []string{"NVIDIA_VISIBLE_DEVICES=0", " NVIDIA_VISIBLE_DEVICES=1"}, spec: []string{"NVIDIA_VISIBLE_DEVICES=1"}, ignored: "the image's own setting"},
			{name: "duplicates, an earlier value is the caller's", image: []string{"NVIDIA_VISIBLE_DEVICES=0", " NVIDIA_VISIBLE_DEVICES=1"}, spec: []string{"NVIDIA_VISIBLE_DEVICES=0"}, want: []string{"0"}},
			{name: "lower case is another name", image: []string{"nvidia_visible_devices=0"}, spec: []string{"nvidia_visible_devices=0"}},
			{name: "lower case, caller's value", image: []string{" nvidia_visible_devices=0"}, spec: []string{"nvidia_visible_devices=0", "NVIDIA_VISIBLE_DEVICES=0"}, want: []string{"0"}},
			{name: "memory after a tab", image: []string{"\tGPUISO_GPU_MEMORY=4GiB"}, spec: []string{"GPUISO_GPU_MEMORY=4GiB"}, ignored: "GPUISO_GPU_MEMORY=4GiB: the image's own setting"},
			{name: "memory key only", image: []string{"GPUISO_GPU_MEMORY"}, spec: []string{"GPUISO_GPU_MEMORY=4GiB"}, ignored: "GPUISO_GPU_MEMORY without a value"},
			{name: "memory by prefix", image: []string{"GPUISO_*"}, spec: []string{"GPUISO_GPU_MEMORY=4GiB", "GPUISO_GPU_COMPUTE=50"}, ignored: "GPUISO_GPU_MEMORY without a value"},
			{name: "caller's memory, image's compute", image: []string{" GPUISO_GPU_COMPUTE=100"}, spec: []string{"GPUISO_GPU_MEMORY=4GiB", "GPUISO_GPU_COMPUTE=100"}, share: true, ignored: "GPUISO_GPU_COMPUTE=100: the image's own setting"},
			{name: "caller's memory", image: []string{" GPUISO_GPU_MEMORY=16GiB"}, spec: []string{"GPUISO_GPU_MEMORY=4GiB"}, share: true},
			{name: "swarm resource", image: []string{" DOCKER_RESOURCE_GPU=0"}, spec: []string{"DOCKER_RESOURCE_GPU=0"}, ignored: "DOCKER_RESOURCE_GPU: not a Docker Swarm task"},
			{name: "swarm slice after a space", image: []string{" DOCKER_RESOURCE_NVIDIA-GPU-SLICE=0::0"}, spec: []string{"DOCKER_RESOURCE_NVIDIA-GPU-SLICE=0::0"}, ignored: "DOCKER_RESOURCE_NVIDIA-GPU-SLICE: not a Docker Swarm task"},
			{name: "swarm slice after tabs", image: []string{"\t \tDOCKER_RESOURCE_NVIDIA-GPU-SLICE=GPU-a::1"}, spec: []string{"DOCKER_RESOURCE_NVIDIA-GPU-SLICE=GPU-a::1"}, ignored: "DOCKER_RESOURCE_NVIDIA-GPU-SLICE: not a Docker Swarm task"},
			{name: "swarm slice key only", image: []string{"DOCKER_RESOURCE_NVIDIA-GPU-SLICE"}, spec: []string{"DOCKER_RESOURCE_NVIDIA-GPU-SLICE=0::3"}, ignored: "DOCKER_RESOURCE_NVIDIA-GPU-SLICE: not a Docker Swarm task"},
			{name: "swarm slice by prefix", image: []string{"DOCKER_RESOURCE_*"}, spec: []string{"DOCKER_RESOURCE_NVIDIA-GPU-SLICE=0::3"}, ignored: "DOCKER_RESOURCE_NVIDIA-GPU-SLICE: not a Docker Swarm task"},
			{name: "swarm slice, task label", task: true, image: []string{"\tDOCKER_RESOURCE_NVIDIA-GPU-SLICE"}, spec: []string{"DOCKER_RESOURCE_NVIDIA-GPU-SLICE=0::3"}, ignored: "DOCKER_RESOURCE_NVIDIA-GPU-SLICE: not a Docker Swarm task"},
			{name: "swarm slice, bad id", image: []string{" DOCKER_RESOURCE_NVIDIA-GPU-SLICE=0::0,0::1"}, spec: []string{"DOCKER_RESOURCE_NVIDIA-GPU-SLICE=0::0,0::1"}, ignored: "DOCKER_RESOURCE_NVIDIA-GPU-SLICE: not a Docker Swarm task"},
			{name: "always", policy: AcceptAlways, image: []string{" NVIDIA_VISIBLE_DEVICES=0,1"}, spec: []string{"NVIDIA_VISIBLE_DEVICES=0,1"}, want: []string{"0", "1"}},
		},
		"docker": {
			{name: "leading space is another name", image: []string{" NVIDIA_VISIBLE_DEVICES=0,1"}, spec: []string{"PATH=/bin", " NVIDIA_VISIBLE_DEVICES=0,1"}},
			{name: "leading tab, caller's value", image: []string{"\tNVIDIA_VISIBLE_DEVICES=0"}, spec: []string{"NVIDIA_VISIBLE_DEVICES=1", "\tNVIDIA_VISIBLE_DEVICES=0"}, want: []string{"1"}},
			{name: "trailing space is another name", image: []string{"NVIDIA_VISIBLE_DEVICES =0"}, spec: []string{"NVIDIA_VISIBLE_DEVICES =0"}},
			{name: "exact", image: []string{"NVIDIA_VISIBLE_DEVICES=all"}, spec: []string{"NVIDIA_VISIBLE_DEVICES=all"}, ignored: "the image's own setting"},
			{name: "key only is dropped", image: []string{"NVIDIA_VISIBLE_DEVICES"}, spec: []string{"PATH=/bin"}},
			{name: "key only, caller's value", image: []string{"NVIDIA_VISIBLE_DEVICES"}, spec: []string{"NVIDIA_VISIBLE_DEVICES=1"}, want: []string{"1"}},
			{name: "prefix is a name, caller's value", image: []string{"NVIDIA_*"}, spec: []string{"NVIDIA_VISIBLE_DEVICES=1"}, want: []string{"1"}},
			{name: "duplicates, the last read", image: []string{"NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_VISIBLE_DEVICES=1"}, spec: []string{"NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_VISIBLE_DEVICES=1"}, ignored: "the image's own setting"},
			{name: "lower case is another name", image: []string{"nvidia_visible_devices=0"}, spec: []string{"nvidia_visible_devices=0"}},
			{name: "memory after a tab", image: []string{"\tGPUISO_GPU_MEMORY=4GiB"}, spec: []string{"\tGPUISO_GPU_MEMORY=4GiB"}},
			{name: "memory", image: []string{"GPUISO_GPU_MEMORY=4GiB"}, spec: []string{"GPUISO_GPU_MEMORY=4GiB"}, ignored: "GPUISO_GPU_MEMORY=4GiB: the image's own setting"},
			{name: "caller's memory", image: []string{" GPUISO_GPU_MEMORY=4GiB"}, spec: []string{"GPUISO_GPU_MEMORY=4GiB", " GPUISO_GPU_MEMORY=4GiB"}, share: true},
			{name: "swarm task, image's resource after a space", task: true, image: []string{" DOCKER_RESOURCE_GPU=GPU-a"}, spec: []string{"DOCKER_RESOURCE_GPU=GPU-b", " DOCKER_RESOURCE_GPU=GPU-a"}, want: []string{"GPU-b"}},
			{name: "swarm task, image's resource", task: true, image: []string{"DOCKER_RESOURCE_GPU=GPU-a"}, spec: []string{"DOCKER_RESOURCE_GPU=GPU-a"}, ignored: "DOCKER_RESOURCE_GPU: the image's own setting"},
			{name: "not a task", image: []string{"\tDOCKER_RESOURCE_GPU=GPU-a"}, spec: []string{"DOCKER_RESOURCE_GPU=GPU-a"}, ignored: "not a Docker Swarm task"},
			{name: "swarm task, image's slice after a tab", task: true, image: []string{"\tDOCKER_RESOURCE_NVIDIA-GPU-SLICE=GPU-a::0"}, spec: []string{"\tDOCKER_RESOURCE_NVIDIA-GPU-SLICE=GPU-a::0"}},
			{name: "swarm task, image's slice after a space, Swarm's", task: true, image: []string{" DOCKER_RESOURCE_NVIDIA-GPU-SLICE=GPU-a::0"}, spec: []string{"DOCKER_RESOURCE_NVIDIA-GPU-SLICE=GPU-b::1", " DOCKER_RESOURCE_NVIDIA-GPU-SLICE=GPU-a::0"}, want: []string{"GPU-b"}, share: true},
			{name: "swarm task, image's slice", task: true, image: []string{"DOCKER_RESOURCE_NVIDIA-GPU-SLICE=GPU-a::0"}, spec: []string{"DOCKER_RESOURCE_NVIDIA-GPU-SLICE=GPU-a::0"}, ignored: "DOCKER_RESOURCE_NVIDIA-GPU-SLICE: the image's own setting"},
			{name: "swarm task, image's bad slice", task: true, image: []string{"DOCKER_RESOURCE_NVIDIA-GPU-SLICE=GPU-a::0,GPU-a::1"}, spec: []string{"DOCKER_RESOURCE_NVIDIA-GPU-SLICE=GPU-a::0,GPU-a::1"}, ignored: "DOCKER_RESOURCE_NVIDIA-GPU-SLICE: the image's own setting"},
			{name: "swarm task, image's slice key only is dropped", task: true, image: []string{"DOCKER_RESOURCE_NVIDIA-GPU-SLICE"}, spec: []string{"PATH=/bin"}},
			{name: "slice, not a task", image: []string{"DOCKER_RESOURCE_NVIDIA-GPU-SLICE=0::0"}, spec: []string{"DOCKER_RESOURCE_NVIDIA-GPU-SLICE=0::0"}, ignored: "DOCKER_RESOURCE_NVIDIA-GPU-SLICE: not a Docker Swarm task"},
			{name: "slice after a tab, not a task", image: []string{"\tDOCKER_RESOURCE_NVIDIA-GPU-SLICE=0::0"}, spec: []string{"DOCKER_RESOURCE_NVIDIA-GPU-SLICE=0::0"}, ignored: "DOCKER_RESOURCE_NVIDIA-GPU-SLICE: not a Docker Swarm task"},
		},
		"containerd": {
			{name: "caller's value, no record", spec: []string{"NVIDIA_VISIBLE_DEVICES=1"}, ignored: "no record of the image"},
			{name: "image's value, no record", image: []string{"NVIDIA_VISIBLE_DEVICES=all"}, spec: []string{"NVIDIA_VISIBLE_DEVICES=all"}, ignored: "no record of the image"},
			{name: "memory, no record", spec: []string{"GPUISO_GPU_MEMORY=4GiB"}, ignored: "GPUISO_GPU_MEMORY=4GiB: no record"},
			{name: "swarm slice, no record", image: []string{"DOCKER_RESOURCE_NVIDIA-GPU-SLICE=0::0"}, spec: []string{"DOCKER_RESOURCE_NVIDIA-GPU-SLICE=0::0"}, ignored: "DOCKER_RESOURCE_NVIDIA-GPU-SLICE: no Docker record shows a Swarm task"},
			{name: "always, leading space is another name", policy: AcceptAlways, image: []string{" NVIDIA_VISIBLE_DEVICES=0"}, spec: []string{" NVIDIA_VISIBLE_DEVICES=0"}},
			{name: "always, key only is dropped", policy: AcceptAlways, image: []string{"NVIDIA_VISIBLE_DEVICES"}, spec: []string{"NVIDIA_VISIBLE_DEVICES"}},
			{name: "always", policy: AcceptAlways, spec: []string{"NVIDIA_VISIBLE_DEVICES=0"}, want: []string{"0"}},
		},
	}
	for engine, rows := range engines {
		t.Run(engine, func(t *testing.T) {
			for _, tc := range rows {
				t.Run(tc.name, func(t *testing.T) {
					policy := tc.policy
					if policy == "" {
						policy = AcceptCaller
					}
					tr := &trust{Policy: policy, Load: func() (*engineRecord, error) {
						if engine == "containerd" {
							return nil, errors.New("no Docker or Podman record of the container's image")
						}
						rec := &engineRecord{Engine: engine, ImageEnv: tc.image}
						if tc.task {
							rec.Labels = map[string]string{swarmTaskLabel: "t1"}
						}
						return rec, nil
					}}
					spec := &specs.Spec{Process: &specs.Process{Env: tc.spec}}
					r, err := requestOf(spec, kind, testSwarm(), tr)
					if err != nil {
						t.Fatal(err)
					}
					if r.All || !slices.Equal(r.IDs, tc.want) || (r.Share != nil) != tc.share {
						t.Errorf("requestOf = devices %+v, share %v; want %q, share %v", r.Devices, r.Share, tc.want, tc.share)
					}
					if got := strings.Join(r.Ignored, "; "); tc.ignored == "" && got != "" || !strings.Contains(got, tc.ignored) {
						t.Errorf("ignored %q, want %q", got, tc.ignored)
					}
				})
			}
		})
	}
}

// TestImageSettingPodman: what Podman makes of an image's entries for one
// variable, entry by entry, the last one deciding.
func TestImageSettingPodman(t *testing.T) {
	for _, tc := range []struct {
		env  []string
		want imageSetting
	}{
		{env: nil},
		{env: []string{"K=1"}, want: imageSetting{Value: "1", Set: true}},
		{env: []string{" \tK=1"}, want: imageSetting{Value: "1", Set: true}},
		{env: []string{"K =1"}},
		{env: []string{"K=1", "K=2"}, want: imageSetting{Value: "2", Set: true}},
		{env: []string{"K"}, want: imageSetting{Passed: true}},
		{env: []string{"K*"}, want: imageSetting{Passed: true}},
		{env: []string{"*"}, want: imageSetting{Passed: true}},
		{env: []string{"KX*"}},
		{env: []string{"K", "K=2"}, want: imageSetting{Value: "2", Set: true}},
		{env: []string{"K=2", "\tK"}, want: imageSetting{Value: "2", Set: true, Passed: true}},
		{env: []string{"k=1"}},
	} {
		r := &engineRecord{Engine: "podman", ImageEnv: tc.env}
		if got := r.imageSetting("K"); got != tc.want {
			t.Errorf("%q: %+v, want %+v", tc.env, got, tc.want)
		}
	}
}
