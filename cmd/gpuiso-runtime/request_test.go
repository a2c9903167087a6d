package main

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/node"
)

func TestParseDevices(t *testing.T) {
	const uuid = "GPU-c85259e4-9a57-11db-56e0-57babeeac58c"
	const mig = "MIG-4a3e2b1c-1111-2222-3333-444455556666"
	for _, tc := range []struct {
		name string
		in   string
		want Devices
		err  bool
	}{
		{name: "empty", in: ""},
		{name: "blank", in: "  "},
		{name: "none", in: "none"},
		{name: "void", in: "void"},
		{name: "all", in: "all", want: Devices{All: true}},
		{name: "all spaced", in: " all ", want: Devices{All: true}},
		{name: "indexes", in: "2,3", want: Devices{IDs: []string{"2", "3"}}},
		{name: "order kept", in: "3,0,1", want: Devices{IDs: []string{"3", "0", "1"}}},
		{name: "spaces", in: " 2 , 3 ", want: Devices{IDs: []string{"2", "3"}}},
		{name: "uuid", in: uuid, want: Devices{IDs: []string{uuid}}},
		{name: "mig uuid", in: mig, want: Devices{IDs: []string{mig}}},
		{name: "legacy mig uuid", in: "MIG-" + uuid + "/1/0", want: Devices{IDs: []string{"MIG-" + uuid + "/1/0"}}},
		{name: "mixed", in: "0," + uuid, want: Devices{IDs: []string{"0", uuid}}},
		{name: "empty entry", in: "1,,2", err: true},
		{name: "trailing comma", in: "1,", err: true},
		{name: "all among others", in: "all,1", err: true},
		{name: "none among others", in: "1,none", err: true},
		{name: "duplicate", in: "1,1", err: true},
		{name: "negative", in: "-1", err: true},
		{name: "huge index", in: "99999999999999999999", err: true},
		{name: "mig index form", in: "0:1", err: true},
		{name: "bare prefix", in: "GPU-", err: true},
		{name: "bad uuid char", in: "GPU-ab;rm", err: true},
		{name: "name", in: "tesla", err: true},
		{name: "bus id", in: "0000:3b:00.0", err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseDevices(tc.in)
			if tc.err {
				if !errors.Is(err, ErrInvalidDevices) || !errors.Is(err, node.ErrInvalid) {
					t.Fatalf("ParseDevices(%q) = %+v, %v; want ErrInvalidDevices", tc.in, got, err)
				}
				if !got.None() {
					t.Errorf("a refused list gives %+v", got)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseDevices(%q): %v", tc.in, err)
			}
			if got.All != tc.want.All || !slices.Equal(got.IDs, tc.want.IDs) {
				t.Errorf("ParseDevices(%q) = %+v, want %+v", tc.in, got, tc.want)
			}
		})
	}
}

// FuzzParseDevices: any input gives a list or ErrInvalidDevices, never a
// panic; an accepted list names each device once, with no empty, "all" or
// separator inside an entry, and parses again to itself.
func FuzzParseDevices(f *testing.F) {
	for _, s := range []string{"", "all", "none", "void", "0", "2,3", "GPU-abc,1", "MIG-x/1/0", "0:1", "1,,2", " 1 , 2 "} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := ParseDevices(s)
		if err != nil {
			if !errors.Is(err, ErrInvalidDevices) {
				t.Fatalf("ParseDevices(%q): %v is no ErrInvalidDevices", s, err)
			}
			return
		}
		seen := map[string]bool{}
		for _, id := range d.IDs {
			if id == "" || id == "all" || strings.ContainsAny(id, ", \t") || seen[id] {
				t.Fatalf("ParseDevices(%q) gives entry %q in %q", s, id, d.IDs)
			}
			seen[id] = true
		}
		if d.All && len(d.IDs) > 0 {
			t.Fatalf("ParseDevices(%q) = %+v: all and ids", s, d)
		}
		if len(d.IDs) > 0 {
			again, err := ParseDevices(strings.Join(d.IDs, ","))
			if err != nil || !slices.Equal(again.IDs, d.IDs) {
				t.Fatalf("ParseDevices(%q) = %q does not parse to itself: %q, %v", s, d.IDs, again.IDs, err)
			}
		}
	})
}

// TestRequestOf: with every setting trusted (--accept-env-request=always),
// the sources in their order.
func TestRequestOf(t *testing.T) {
	const kind = "nvidia.com/gpu"
	swarm := defaultSwarmResources
	spec := func(env []string, ann map[string]string) *specs.Spec {
		return &specs.Spec{Process: &specs.Process{Env: env}, Annotations: ann}
	}
	for _, tc := range []struct {
		name   string
		spec   *specs.Spec
		want   []string
		all    bool
		source string
		err    bool
	}{
		{name: "nothing", spec: spec([]string{"PATH=/bin"}, nil)},
		{name: "no process", spec: &specs.Spec{}},
		{name: "visible devices", spec: spec([]string{"NVIDIA_VISIBLE_DEVICES=2,3"}, nil), want: []string{"2", "3"}, source: "NVIDIA_VISIBLE_DEVICES"},
		{name: "last setting wins", spec: spec([]string{"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=1"}, nil), want: []string{"1"}, source: "NVIDIA_VISIBLE_DEVICES"},
		{name: "all", spec: spec([]string{"NVIDIA_VISIBLE_DEVICES=all"}, nil), all: true, source: "NVIDIA_VISIBLE_DEVICES"},
		{name: "void", spec: spec([]string{"NVIDIA_VISIBLE_DEVICES=void"}, nil), source: "NVIDIA_VISIBLE_DEVICES"},
		{name: "swarm over image's all", spec: spec([]string{"NVIDIA_VISIBLE_DEVICES=all", "DOCKER_RESOURCE_NVIDIA-GPU=GPU-a,GPU-b"}, nil), want: []string{"GPU-a", "GPU-b"}, source: "DOCKER_RESOURCE_NVIDIA-GPU"},
		{name: "swarm two names", spec: spec([]string{"DOCKER_RESOURCE_GPU=GPU-b", "DOCKER_RESOURCE_NVIDIA-GPU=GPU-a"}, nil), want: []string{"GPU-a", "GPU-b"}, source: "DOCKER_RESOURCE_NVIDIA-GPU, DOCKER_RESOURCE_GPU"},
		{name: "swarm other resource ignored", spec: spec([]string{"DOCKER_RESOURCE_FPGA=x", "NVIDIA_VISIBLE_DEVICES=0"}, nil), want: []string{"0"}, source: "NVIDIA_VISIBLE_DEVICES"},
		{name: "swarm all refused", spec: spec([]string{"DOCKER_RESOURCE_GPU=all"}, nil), err: true},
		{name: "swarm duplicate across names", spec: spec([]string{"DOCKER_RESOURCE_GPU=GPU-a", "DOCKER_RESOURCE_NVIDIA-GPU=GPU-a"}, nil), err: true},
		{name: "cdi", spec: spec([]string{"NVIDIA_VISIBLE_DEVICES=all"}, map[string]string{"cdi.k8s.io/ctr": "nvidia.com/gpu=1,nvidia.com/gpu=GPU-x"}), want: []string{"1", "GPU-x"}, source: "cdi.k8s.io/ctr"},
		{name: "cdi other kind", spec: spec([]string{"NVIDIA_VISIBLE_DEVICES=0"}, map[string]string{"cdi.k8s.io/x": "vendor.com/fpga=1"}), want: []string{"0"}, source: "NVIDIA_VISIBLE_DEVICES"},
		{name: "cdi all", spec: spec(nil, map[string]string{"cdi.k8s.io/x": "nvidia.com/gpu=all"}), all: true, source: "cdi.k8s.io/x"},
		{name: "cdi bad name", spec: spec(nil, map[string]string{"cdi.k8s.io/x": "not a name"}), err: true},
		{name: "bad list", spec: spec([]string{"NVIDIA_VISIBLE_DEVICES=1,,2"}, nil), err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := requestOf(tc.spec, kind, swarmNames{GPUs: swarm, Memory: defaultSwarmMemoryResource}, &trust{Policy: AcceptAlways, CDIAnnotations: true})
			if tc.err {
				if !errors.Is(err, ErrInvalidDevices) {
					t.Fatalf("requestOf = %+v, %v; want ErrInvalidDevices", r, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if r.All != tc.all || !slices.Equal(r.IDs, tc.want) || r.Source != tc.source {
				t.Errorf("requestOf = %+v, want ids %q all %v source %q", r, tc.want, tc.all, tc.source)
			}
		})
	}
}

// TestRequestPolicy: only what the caller set is a request. The engine's
// record of the image tells the image's own environment and annotations
// from the caller's; DOCKER_RESOURCE_* counts only for a Docker Swarm task.
func TestRequestPolicy(t *testing.T) {
	const kind = "nvidia.com/gpu"
	swarm := defaultSwarmResources
	spec := func(env []string, ann map[string]string) *specs.Spec {
		return &specs.Spec{Process: &specs.Process{Env: env}, Annotations: ann}
	}
	privileged := spec([]string{"NVIDIA_VISIBLE_DEVICES=2"}, nil)
	privileged.Process.Capabilities = &specs.LinuxCapabilities{Bounding: []string{"CAP_CHOWN", "CAP_SYS_ADMIN"}}
	cudaImage := &engineRecord{Engine: "docker", ImageEnv: []string{"PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all"}}
	imageResources := &engineRecord{Engine: "docker", ImageEnv: []string{"DOCKER_RESOURCE_GPU=0,1"}}
	task := &engineRecord{Engine: "docker", ImageEnv: []string{"NVIDIA_VISIBLE_DEVICES=all"},
		Labels: map[string]string{"com.docker.swarm.task.id": "t1"}}
	taskImageResources := &engineRecord{Engine: "docker", ImageEnv: []string{"DOCKER_RESOURCE_NVIDIA-GPU=GPU-a"},
		Labels: map[string]string{"com.docker.swarm.task.id": "t1"}}
	spoofedTask := &engineRecord{Engine: "docker", ImageEnv: []string{"DOCKER_RESOURCE_GPU=GPU-a"},
		ImageLabels: map[string]string{"com.docker.swarm.task.id": "t1"}, Labels: map[string]string{"com.docker.swarm.task.id": "t1"}}
	podmanImage := &engineRecord{Engine: "podman", ImageEnv: []string{"NVIDIA_VISIBLE_DEVICES=none"},
		ImageAnnotations: map[string]string{"cdi.k8s.io/img": "nvidia.com/gpu=all", "com.nvidia.volumes.needed": "nvidia_driver"}}
	podman := map[string]string{"io.container.manager": "libpod"}
	with := func(m map[string]string, k, v string) map[string]string {
		out := map[string]string{k: v}
		for k, v := range m {
			out[k] = v
		}
		return out
	}
	for _, tc := range []struct {
		name    string
		policy  AcceptEnv
		spec    *specs.Spec
		rec     *engineRecord // nil: no record
		want    []string
		all     bool
		volume  bool // the driver volume asked for beside GPUs
		cdi     bool // --accept-cdi-annotations
		source  string
		ignored string // in Ignored
	}{
		{name: "image's own all", spec: spec([]string{"NVIDIA_VISIBLE_DEVICES=all"}, nil), rec: cudaImage, ignored: "NVIDIA_VISIBLE_DEVICES=all: the image's own"},
		{name: "caller's over the image's", spec: spec([]string{"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=1"}, nil), rec: cudaImage, want: []string{"1"}, volume: true, source: "NVIDIA_VISIBLE_DEVICES"},
		{name: "caller's all over an image without", spec: spec([]string{"NVIDIA_VISIBLE_DEVICES=all"}, nil), rec: &engineRecord{Engine: "podman"}, all: true, volume: true, source: "NVIDIA_VISIBLE_DEVICES"},
		{name: "no record", spec: spec([]string{"NVIDIA_VISIBLE_DEVICES=1"}, nil), ignored: "no record of the image"},
		{name: "no record, always", policy: AcceptAlways, spec: spec([]string{"NVIDIA_VISIBLE_DEVICES=1"}, nil), want: []string{"1"}, volume: true, source: "NVIDIA_VISIBLE_DEVICES"},
		{name: "never", policy: AcceptNever, spec: spec([]string{"NVIDIA_VISIBLE_DEVICES=1"}, nil), rec: cudaImage, ignored: "--accept-env-request=never"},
		{name: "never keeps CDI", policy: AcceptNever, cdi: true, spec: spec([]string{"NVIDIA_VISIBLE_DEVICES=1"}, map[string]string{"cdi.k8s.io/c": "nvidia.com/gpu=3"}), rec: cudaImage, want: []string{"3"}, source: "cdi.k8s.io/c", ignored: "never"},
		{name: "privileged", policy: AcceptPrivileged, spec: privileged, want: []string{"2"}, volume: true, source: "NVIDIA_VISIBLE_DEVICES"},
		{name: "privileged policy, unprivileged", policy: AcceptPrivileged, spec: spec([]string{"NVIDIA_VISIBLE_DEVICES=2"}, nil), ignored: "no record"},
		{name: "caller policy, privileged", spec: privileged, ignored: "no record"},
		{name: "image's DOCKER_RESOURCE under the caller's void", spec: spec([]string{"DOCKER_RESOURCE_GPU=0,1", "NVIDIA_VISIBLE_DEVICES=void"}, nil), rec: imageResources, source: "NVIDIA_VISIBLE_DEVICES", ignored: "DOCKER_RESOURCE_GPU: not a Docker Swarm task"},
		{name: "image's DOCKER_RESOURCE alone", spec: spec([]string{"DOCKER_RESOURCE_GPU=0,1"}, nil), rec: imageResources, ignored: "DOCKER_RESOURCE_GPU: not a Docker Swarm task"},
		{name: "DOCKER_RESOURCE without a record", spec: spec([]string{"DOCKER_RESOURCE_GPU=0,1"}, nil), ignored: "no Docker record shows a Swarm task"},
		{name: "swarm task", spec: spec([]string{"NVIDIA_VISIBLE_DEVICES=all", "DOCKER_RESOURCE_NVIDIA-GPU=GPU-a,GPU-b"}, nil), rec: task, want: []string{"GPU-a", "GPU-b"}, source: "DOCKER_RESOURCE_NVIDIA-GPU", ignored: "NVIDIA_VISIBLE_DEVICES=all: the image's own"},
		{name: "swarm task, image's resource value", spec: spec([]string{"DOCKER_RESOURCE_NVIDIA-GPU=GPU-a"}, nil), rec: taskImageResources, ignored: "DOCKER_RESOURCE_NVIDIA-GPU: the image's own"},
		{name: "task label from the image", spec: spec([]string{"DOCKER_RESOURCE_GPU=GPU-b"}, nil), rec: spoofedTask, ignored: "not a Docker Swarm task"},
		{name: "podman image annotation", spec: spec(nil, with(podman, "cdi.k8s.io/img", "nvidia.com/gpu=all")), rec: podmanImage, ignored: "annotation cdi.k8s.io/img: the image's own"},
		{name: "podman caller annotation", spec: spec(nil, with(podman, "cdi.k8s.io/img", "nvidia.com/gpu=1")), rec: podmanImage, want: []string{"1"}, source: "cdi.k8s.io/img"},
		{name: "podman without record", spec: spec(nil, with(podman, "cdi.k8s.io/x", "nvidia.com/gpu=1")), ignored: "Podman copies image annotations"},
		{name: "annotation without record, not podman", spec: spec(nil, map[string]string{"cdi.k8s.io/x": "nvidia.com/gpu=1"}), ignored: "annotation cdi.k8s.io/x: a CDI annotation of a container Podman did not create (--accept-cdi-annotations is false)"},
		{name: "annotation without record, not podman, accepted", cdi: true, spec: spec(nil, map[string]string{"cdi.k8s.io/x": "nvidia.com/gpu=1"}), want: []string{"1"}, source: "cdi.k8s.io/x"},
		{name: "docker caller annotation", spec: spec(nil, map[string]string{"cdi.k8s.io/x": "nvidia.com/gpu=1"}), rec: cudaImage, ignored: "--accept-cdi-annotations is false"},
		{name: "docker caller annotation, accepted", cdi: true, spec: spec(nil, map[string]string{"cdi.k8s.io/x": "nvidia.com/gpu=1"}), rec: cudaImage, want: []string{"1"}, source: "cdi.k8s.io/x"},
		{name: "always, annotation not accepted", policy: AcceptAlways, spec: spec(nil, map[string]string{"cdi.k8s.io/x": "nvidia.com/gpu=1"}), ignored: "--accept-cdi-annotations is false"},
		{name: "podman label forged, no record", spec: spec(nil, with(podman, "cdi.k8s.io/x", "nvidia.com/gpu=1")), rec: cudaImage, ignored: "--accept-cdi-annotations is false"},
		{name: "image's none", spec: spec([]string{"NVIDIA_VISIBLE_DEVICES=none"}, podman), rec: podmanImage, ignored: "the image's own"},
		{name: "caller's none", spec: spec([]string{"NVIDIA_VISIBLE_DEVICES=none"}, nil), rec: cudaImage, volume: true, source: "NVIDIA_VISIBLE_DEVICES"},
		{name: "image's volume annotation", spec: spec(nil, with(podman, "com.nvidia.volumes.needed", "nvidia_driver")), rec: podmanImage, ignored: "annotation com.nvidia.volumes.needed"},
		{name: "caller's volume annotation", spec: spec(nil, map[string]string{"com.nvidia.volumes.needed": "nvidia_driver"}), volume: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			policy := tc.policy
			if policy == "" {
				policy = AcceptCaller
			}
			loads := 0
			tr := &trust{Policy: policy, CDIAnnotations: tc.cdi, Load: func() (*engineRecord, error) {
				loads++
				if tc.rec == nil {
					return nil, errors.New("no record here")
				}
				return tc.rec, nil
			}}
			r, err := requestOf(tc.spec, kind, swarmNames{GPUs: swarm, Memory: defaultSwarmMemoryResource}, tr)
			if err != nil {
				t.Fatal(err)
			}
			if r.All != tc.all || !slices.Equal(r.IDs, tc.want) || r.Source != tc.source || r.Volume != tc.volume {
				t.Errorf("requestOf = %+v, want ids %q all %v source %q volume %v", r, tc.want, tc.all, tc.source, tc.volume)
			}
			if got := strings.Join(r.Ignored, "; "); tc.ignored == "" && got != "" || !strings.Contains(got, tc.ignored) {
				t.Errorf("ignored %q, want %q", got, tc.ignored)
			}
			if loads > 1 {
				t.Errorf("the record was loaded %d times", loads)
			}
		})
	}
	t.Run("no record needed", func(t *testing.T) {
		tr := &trust{Policy: AcceptCaller, Load: func() (*engineRecord, error) { t.Error("record loaded"); return nil, nil }}
		if _, err := requestOf(spec([]string{"PATH=/bin"}, map[string]string{"other": "x"}), kind, swarmNames{GPUs: swarm, Memory: defaultSwarmMemoryResource}, tr); err != nil {
			t.Fatal(err)
		}
	})
}

// TestRequestShare: a memory share is asked for by Swarm's memory resource
// (MiB, only in a Swarm task) or by GPUISO_GPU_MEMORY (as the policy trusts
// NVIDIA_VISIBLE_DEVICES), with GPUISO_GPU_COMPUTE beside either; a device
// request beside it names the share's one GPU.
func TestRequestShare(t *testing.T) {
	const kind = "nvidia.com/gpu"
	const gib4 = 4 << 30
	spec := func(env ...string) *specs.Spec { return &specs.Spec{Process: &specs.Process{Env: env}} }
	task := &engineRecord{Engine: "docker", ImageEnv: []string{"NVIDIA_VISIBLE_DEVICES=all"}, Labels: map[string]string{"com.docker.swarm.task.id": "t1"}}
	taskImageVRAM := &engineRecord{Engine: "docker", ImageEnv: []string{"DOCKER_RESOURCE_VRAM=4000"}, Labels: map[string]string{"com.docker.swarm.task.id": "t1"}}
	plain := &engineRecord{Engine: "docker"}
	imageShare := &engineRecord{Engine: "docker", ImageEnv: []string{"GPUISO_GPU_MEMORY=16GiB", "GPUISO_GPU_COMPUTE=100"}}
	for _, tc := range []struct {
		name    string
		policy  AcceptEnv
		spec    *specs.Spec
		rec     *engineRecord
		memory  uint64 // 0: no share
		compute int
		source  string // the share's
		ids     []string
		ignored string
		err     bool
	}{
		{name: "swarm task", spec: spec("NVIDIA_VISIBLE_DEVICES=all", "DOCKER_RESOURCE_VRAM=4000"), rec: task, memory: 4000 << 20, source: "DOCKER_RESOURCE_VRAM", ignored: "NVIDIA_VISIBLE_DEVICES=all: the image's own"},
		{name: "swarm task with its GPU", spec: spec("DOCKER_RESOURCE_VRAM=8000", "DOCKER_RESOURCE_NVIDIA-GPU=GPU-a"), rec: task, memory: 8000 << 20, source: "DOCKER_RESOURCE_VRAM", ids: []string{"GPU-a"}},
		{name: "swarm task, caller's compute", spec: spec("DOCKER_RESOURCE_VRAM=4000", "GPUISO_GPU_COMPUTE=25"), rec: task, memory: 4000 << 20, compute: 25, source: "DOCKER_RESOURCE_VRAM, GPUISO_GPU_COMPUTE"},
		{name: "swarm over GPUISO_GPU_MEMORY", spec: spec("DOCKER_RESOURCE_VRAM=4000", "GPUISO_GPU_MEMORY=1GiB"), rec: task, memory: 4000 << 20, source: "DOCKER_RESOURCE_VRAM", ignored: "GPUISO_GPU_MEMORY=1GiB: DOCKER_RESOURCE_VRAM asks already"},
		{name: "swarm, image's amount", spec: spec("DOCKER_RESOURCE_VRAM=4000"), rec: taskImageVRAM, ignored: "DOCKER_RESOURCE_VRAM: the image's own"},
		{name: "not a swarm task", spec: spec("DOCKER_RESOURCE_VRAM=4000"), rec: plain, ignored: "DOCKER_RESOURCE_VRAM: not a Docker Swarm task"},
		{name: "no record", spec: spec("DOCKER_RESOURCE_VRAM=4000", "GPUISO_GPU_MEMORY=4GiB"), ignored: "GPUISO_GPU_MEMORY=4GiB: no record"},
		{name: "always", policy: AcceptAlways, spec: spec("DOCKER_RESOURCE_VRAM=4000"), memory: 4000 << 20, source: "DOCKER_RESOURCE_VRAM"},
		{name: "caller's memory", spec: spec("GPUISO_GPU_MEMORY=4GiB"), rec: plain, memory: gib4, source: "GPUISO_GPU_MEMORY"},
		{name: "caller's memory and compute on GPU 3", spec: spec("GPUISO_GPU_MEMORY=4G", "GPUISO_GPU_COMPUTE=50", "NVIDIA_VISIBLE_DEVICES=3"), rec: plain, memory: gib4, compute: 50, source: "GPUISO_GPU_MEMORY, GPUISO_GPU_COMPUTE", ids: []string{"3"}},
		{name: "caller's memory, all", spec: spec("GPUISO_GPU_MEMORY=4GiB", "NVIDIA_VISIBLE_DEVICES=all"), rec: plain, memory: gib4, source: "GPUISO_GPU_MEMORY"},
		{name: "image's memory and compute", spec: spec("GPUISO_GPU_MEMORY=16GiB", "GPUISO_GPU_COMPUTE=100"), rec: imageShare, ignored: "GPUISO_GPU_COMPUTE=100: the image's own"},
		{name: "never", policy: AcceptNever, spec: spec("GPUISO_GPU_MEMORY=4GiB"), rec: plain, ignored: "GPUISO_GPU_MEMORY=4GiB: --accept-env-request=never"},
		{name: "never keeps swarm", policy: AcceptNever, spec: spec("DOCKER_RESOURCE_VRAM=100"), rec: task, memory: 100 << 20, source: "DOCKER_RESOURCE_VRAM"},
		{name: "swarm zero", spec: spec("DOCKER_RESOURCE_VRAM=0"), rec: task, err: true},
		{name: "swarm not a number", spec: spec("DOCKER_RESOURCE_VRAM=4G"), rec: task, err: true},
		{name: "swarm too much", spec: spec("DOCKER_RESOURCE_VRAM=99999999999"), rec: task, err: true},
		{name: "memory unparsable", spec: spec("GPUISO_GPU_MEMORY=lots"), rec: plain, err: true},
		{name: "compute without memory", spec: spec("GPUISO_GPU_COMPUTE=50"), rec: plain, err: true},
		{name: "compute over 100", spec: spec("GPUISO_GPU_MEMORY=1G", "GPUISO_GPU_COMPUTE=101"), rec: plain, err: true},
		{name: "share of two GPUs", spec: spec("GPUISO_GPU_MEMORY=1G", "NVIDIA_VISIBLE_DEVICES=0,1"), rec: plain, err: true},
		{name: "share of a MIG device", spec: spec("GPUISO_GPU_MEMORY=1G", "NVIDIA_VISIBLE_DEVICES=MIG-abc"), rec: plain, err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			policy := tc.policy
			if policy == "" {
				policy = AcceptCaller
			}
			tr := &trust{Policy: policy, Load: func() (*engineRecord, error) {
				if tc.rec == nil {
					return nil, errors.New("no record here")
				}
				return tc.rec, nil
			}}
			r, err := requestOf(tc.spec, kind, testSwarm(), tr)
			if tc.err {
				if !errors.Is(err, ErrInvalidShare) || !errors.Is(err, node.ErrInvalid) {
					t.Fatalf("requestOf = %+v, %v; want ErrInvalidShare", r, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case tc.memory == 0 && r.Share != nil:
				t.Errorf("share %+v from %q, want none", *r.Share, r.ShareSource)
			case tc.memory != 0 && (r.Share == nil || r.Share.MemoryBytes != tc.memory || r.Share.ComputePercent != tc.compute || r.Share.Mode != allocator.ShareMemory || r.ShareSource != tc.source):
				t.Errorf("share %+v from %q, want %d bytes, %d%% compute from %q", r.Share, r.ShareSource, tc.memory, tc.compute, tc.source)
			}
			if !slices.Equal(r.IDs, tc.ids) || (tc.memory != 0 && r.All) {
				t.Errorf("devices %+v, want %q", r.Devices, tc.ids)
			}
			if got := strings.Join(r.Ignored, "; "); tc.ignored == "" && got != "" || !strings.Contains(got, tc.ignored) {
				t.Errorf("ignored %q, want %q", got, tc.ignored)
			}
			if tc.memory != 0 {
				al := r.allocation(nil)
				if al.Share == nil || *al.Share != *r.Share || !slices.Equal(al.Devices, tc.ids) || al.Count != 0 {
					t.Errorf("allocation %+v", al)
				}
				if env := requestEnv(r); len(env) != 1 || !strings.HasPrefix(env[0], "NVIDIA_VISIBLE_DEVICES=") || env[0] == "NVIDIA_VISIBLE_DEVICES=void" {
					t.Errorf("request env %q: the preparer must see a container that needs the driver", env)
				}
			}
		})
	}
}

// FuzzRequestShare: any Swarm amount, GPUISO_GPU_MEMORY and
// GPUISO_GPU_COMPUTE give a valid share of at most one GPU, or
// ErrInvalidShare, never a panic or a share the allocator refuses.
func FuzzRequestShare(f *testing.F) {
	for _, s := range [][3]string{{"4000", "", ""}, {"", "4GiB", "50"}, {"0", "", ""}, {"", "1", "100"}, {"18446744073709551615", "", ""}, {"", "4 G", "0"}, {"8000", "1T", "x"}} {
		f.Add(s[0], s[1], s[2])
	}
	f.Fuzz(func(t *testing.T, vram, memory, compute string) {
		var env []string
		for k, v := range map[string]string{"DOCKER_RESOURCE_VRAM": vram, "GPUISO_GPU_MEMORY": memory, "GPUISO_GPU_COMPUTE": compute} {
			if v != "" {
				env = append(env, k+"="+v)
			}
		}
		r, err := requestOf(&specs.Spec{Process: &specs.Process{Env: env}}, "nvidia.com/gpu", testSwarm(), &trust{Policy: AcceptAlways})
		if err != nil {
			if !errors.Is(err, ErrInvalidShare) {
				t.Fatalf("%q: %v is no ErrInvalidShare", env, err)
			}
			return
		}
		if r.Share == nil {
			return
		}
		if err := r.Share.Validate(); err != nil || r.Share.Mode != allocator.ShareMemory || len(r.IDs) > 1 {
			t.Fatalf("%q: share %+v, devices %+v: %v", env, *r.Share, r.Devices, err)
		}
	})
}

// TestParseDevicesLinear: a list of 100,000 distinct entries parses in one
// pass, and a duplicate at its end is found (BenchmarkParseDevices times
// it).
func TestParseDevicesLinear(t *testing.T) {
	ids := longList(100_000)
	d, err := ParseDevices(strings.Join(ids, ","))
	if err != nil || len(d.IDs) != len(ids) {
		t.Fatalf("%d ids, %v", len(d.IDs), err)
	}
	_, err = ParseDevices(strings.Join(append(ids, ids[0]), ","))
	if !errors.Is(err, ErrInvalidDevices) || !strings.Contains(err.Error(), "named twice") || len(err.Error()) > 400 {
		t.Fatalf("duplicate: %v", err)
	}
}

// longList returns n distinct GPU- UUIDs.
func longList(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("GPU-%08x-0000-0000-0000-000000000000", i)
	}
	return ids
}

func BenchmarkParseDevices(b *testing.B) {
	list := strings.Join(longList(100_000), ",")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseDevices(list); err != nil {
			b.Fatal(err)
		}
	}
}
