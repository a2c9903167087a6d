package isolator_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/moby/moby/api/types/container"
	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/isolator/dockerconfig"
	"github.com/gpuiso/gpuiso/isolator/mps"
	"github.com/gpuiso/gpuiso/isolator/oci"
	"github.com/gpuiso/gpuiso/node"
)

// TestPlanMPS pins what a memory share's container gets of its MPS daemon:
// the pipe directory at /tmp/nvidia-mps and the daemon's /dev/shm, both
// read-write, nosuid, nodev and noexec, and CUDA_MPS_PIPE_DIRECTORY; the
// OCI and Docker renderings carry the same, writable.
func TestPlanMPS(t *testing.T) {
	inv := migInv()
	m := isolator.MPS{PipeDir: "/var/lib/gpuiso/mps/job/pipe", ShmDir: "/var/lib/gpuiso/mps/job/shm/"}
	limit := []string{"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M"}
	plan, err := isolator.NewPlan("job", inv, []node.DeviceRef{inv.Devices[1].Ref()}, nil, limit, isolator.WithMPS(m))
	if err != nil {
		t.Fatal(err)
	}
	want := []specs.Mount{
		{Source: "/var/lib/gpuiso/mps/job/pipe", Destination: "/tmp/nvidia-mps", Type: "bind", Options: []string{"rbind", "rw", "nosuid", "nodev", "noexec"}},
		{Source: "/var/lib/gpuiso/mps/job/shm", Destination: "/dev/shm", Type: "bind", Options: []string{"rbind", "rw", "nosuid", "nodev", "noexec"}},
	}
	if !slices.EqualFunc(plan.Mounts, want, func(a, b specs.Mount) bool {
		return a.Source == b.Source && a.Destination == b.Destination && a.Type == b.Type && slices.Equal(a.Options, b.Options)
	}) {
		t.Fatalf("mounts = %+v", plan.Mounts)
	}
	env := envMap(plan.Env)
	if env["CUDA_MPS_PIPE_DIRECTORY"] != "/tmp/nvidia-mps" || env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] != "0=4096M" || env["CUDA_VISIBLE_DEVICES"] != inv.Devices[1].UUID {
		t.Fatalf("env = %v", plan.Env)
	}
	if plan.MPS == nil || plan.MPS.ShmDir != "/var/lib/gpuiso/mps/job/shm" {
		t.Fatalf("plan.MPS = %+v", plan.MPS)
	}
	// The image's own /dev/shm is replaced, not doubled.
	spec := &specs.Spec{Process: &specs.Process{}, Linux: &specs.Linux{}, Mounts: []specs.Mount{{Destination: "/dev/shm", Type: "tmpfs", Source: "shm"}}}
	if err := oci.Apply(spec, plan); err != nil {
		t.Fatal(err)
	}
	var shm []specs.Mount
	for _, mnt := range spec.Mounts {
		if mnt.Destination == "/dev/shm" {
			shm = append(shm, mnt)
		}
	}
	if len(shm) != 1 || shm[0].Source != m.ShmDir[:len(m.ShmDir)-1] {
		t.Fatalf("OCI /dev/shm mounts = %+v", shm)
	}
	dc, err := dockerconfig.New(plan)
	if err != nil {
		t.Fatal(err)
	}
	cfg, hc := &container.Config{}, &container.HostConfig{}
	if err := dc.Apply(cfg, hc); err != nil {
		t.Fatal(err)
	}
	if len(hc.Mounts) != 2 || hc.Mounts[0].ReadOnly || hc.Mounts[1].ReadOnly || hc.Mounts[1].Target != "/dev/shm" {
		t.Fatalf("Docker mounts = %+v", hc.Mounts)
	}
}

// TestPlanMPSRejects: an MPS share is of one GPU or MIG device, with
// absolute directories.
func TestPlanMPSRejects(t *testing.T) {
	inv := migInv()
	m := isolator.MPS{PipeDir: "/p", ShmDir: "/s"}
	for name, tc := range map[string]struct {
		gpus []node.DeviceRef
		m    isolator.MPS
	}{
		"two GPUs": {[]node.DeviceRef{inv.Devices[1].Ref(), inv.Devices[0].MIGRef(inv.Devices[0].MIGDevices[0])}, m},
		"no GPU":   {nil, m},
		"relative": {[]node.DeviceRef{inv.Devices[1].Ref()}, isolator.MPS{PipeDir: "p", ShmDir: "/s"}},
	} {
		if _, err := isolator.NewPlan("job", inv, tc.gpus, nil, nil, isolator.WithMPS(tc.m)); !errors.Is(err, isolator.ErrInvalidMPS) || !errors.Is(err, node.ErrInvalid) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestPlanMIGShare: a share of a MIG device gets its daemon as a GPU's
// share does, beside the MIG device's nodes.
func TestPlanMIGShare(t *testing.T) {
	inv := migInv()
	ref := inv.Devices[0].MIGRef(inv.Devices[0].MIGDevices[0])
	d := &mps.Daemon{PipeDir: "/p", ShmDir: "/s", Limits: mps.Limits{MemoryBytes: 1 << 30}}
	p, err := isolator.NewPlan("job", inv, []node.DeviceRef{ref}, nil, nil, isolator.WithShare(d))
	if err != nil {
		t.Fatal(err)
	}
	if p.MPS == nil || len(p.Mounts) != 2 || p.Mounts[0].Destination != isolator.MPSPipeDir || p.Mounts[1].Destination != isolator.MPSShmDir {
		t.Fatalf("plan of a MIG device's share: MPS %+v, mounts %+v", p.MPS, p.Mounts)
	}
	if !slices.Contains(p.Env, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=1024M") {
		t.Fatalf("env %v", p.Env)
	}
}

// TestPlanShare: WithShare is the one option that gives a memory share's
// container its daemon: the directories, CUDA_MPS_PIPE_DIRECTORY and the
// client limits of the daemon's own limits, after the plan's env; a nil
// daemon (no memory share) adds nothing.
func TestPlanShare(t *testing.T) {
	inv := migInv()
	gpu := []node.DeviceRef{inv.Devices[1].Ref()}
	d := &mps.Daemon{PipeDir: "/var/lib/gpuiso/mps/job/pipe", ShmDir: "/var/lib/gpuiso/mps/job/shm", Limits: mps.Limits{MemoryBytes: 4 << 30, ComputePercent: 50}}
	plan, err := isolator.NewPlan("job", inv, gpu, nil, []string{"A=1"}, isolator.WithShare(d))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"NVIDIA_VISIBLE_DEVICES=" + inv.Devices[1].UUID, "CUDA_VISIBLE_DEVICES=" + inv.Devices[1].UUID, "A=1",
		"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M", "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
	}
	if !slices.Equal(plan.Env, want) {
		t.Fatalf("env = %q, want %q", plan.Env, want)
	}
	if len(plan.Mounts) != 2 || plan.Mounts[0].Source != d.PipeDir || plan.Mounts[1].Source != d.ShmDir || plan.MPS == nil {
		t.Fatalf("mounts %+v, MPS %+v", plan.Mounts, plan.MPS)
	}
	plain, err := isolator.NewPlan("job", inv, gpu, nil, nil, isolator.WithShare(nil))
	if err != nil {
		t.Fatal(err)
	}
	if len(plain.Mounts) != 0 || plain.MPS != nil || len(plain.Env) != 2 {
		t.Fatalf("no daemon: mounts %+v, MPS %+v, env %q", plain.Mounts, plain.MPS, plain.Env)
	}
}
