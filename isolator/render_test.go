package isolator_test

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/moby/moby/api/types/container"
	"github.com/opencontainers/runtime-spec/specs-go"
	cdilib "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/isolator/cdi"
	"github.com/gpuiso/gpuiso/isolator/dockerconfig"
	"github.com/gpuiso/gpuiso/isolator/oci"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/volume"
)

// rendering is what a renderer gave a container, in one form: device
// nodes ("<container path> <host path> <major>:<minor>", a part unknown to
// the renderer left out), mounts ("<destination> <source> ro|rw") and the
// environment.
type rendering struct {
	devices, hostPaths, numbers []string
	rules                       []string // allow rules beyond the defaults
	mounts                      []string
	env                         map[string]string
}

func envMap(env []string) map[string]string {
	m := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return m
}

func ro(opts []string) string {
	if slices.Contains(opts, "ro") {
		return "ro"
	}
	return "rw"
}

// fromOCI reads a rendering from an OCI spec (oci.Apply, or a CDI
// runtime's injection).
func fromOCI(s *specs.Spec) rendering {
	var r rendering
	for _, d := range s.Linux.Devices {
		r.devices = append(r.devices, d.Path)
		r.numbers = append(r.numbers, fmt.Sprintf("%s %d:%d", d.Path, d.Major, d.Minor))
	}
	if s.Linux.Resources != nil {
		for _, c := range s.Linux.Resources.Devices {
			rule := isolator.Rule{Allow: c.Allow, Type: c.Type[0], Major: *c.Major, Minor: *c.Minor, Access: c.Access}
			if c.Allow && !slices.Contains(isolator.DefaultRules(), rule) {
				r.rules = append(r.rules, rule.String())
			}
		}
	}
	for _, m := range s.Mounts {
		r.mounts = append(r.mounts, m.Destination+" "+m.Source+" "+ro(m.Options))
	}
	r.env = envMap(s.Process.Env)
	return r
}

// TestRenderersAgree renders one plan (two GPUs, a MIG device, the driver
// volume, an image whose PATH holds its own tool directory) as the native
// containerizer takes it, through the OCI editor, the Docker configuration
// and the CDI spec a CDI runtime injects, and checks that the container gets the
// same devices, mounts and environment from each: the visible-device
// variables name every device, and PATH keeps the image's directories.
func TestRenderersAgree(t *testing.T) {
	inv := migInv()
	gpus := []node.DeviceRef{inv.Devices[1].Ref(), inv.Devices[0].MIGRef(inv.Devices[0].MIGDevices[0])}
	imageEnv := []string{"PATH=/opt/tool/bin:/usr/bin:/bin", "LD_LIBRARY_PATH=/opt/tool/lib", "TOOL=1"}
	vol := &volume.Volume{Version: "535.104.05", Path: "/var/lib/gpuiso/volumes/535.104.05"}
	inj := vol.Injection(imageEnv)
	mount := specs.Mount{Source: inj.Mount.Source, Destination: inj.Mount.Destination, Type: inj.Mount.Type, Options: inj.Mount.Options}
	plan, err := isolator.NewPlan("task-1", inv, gpus, []specs.Mount{mount}, inj.Env)
	if err != nil {
		t.Fatal(err)
	}

	base := func() *specs.Spec {
		return &specs.Spec{Process: &specs.Process{Env: slices.Clone(imageEnv)}, Linux: &specs.Linux{}}
	}
	ociSpec := base()
	if err := oci.Apply(ociSpec, plan); err != nil {
		t.Fatal(err)
	}
	ociView := fromOCI(ociSpec)

	// The native containerizer takes the plan as it is: its nodes into the
	// container's /dev, its rules into the cgroup, its environment merged
	// over the image's, its mounts.
	var native rendering
	for _, d := range plan.Devices {
		native.devices = append(native.devices, d.Path)
		native.numbers = append(native.numbers, fmt.Sprintf("%s %d:%d", d.Path, d.Major, d.Minor))
	}
	for _, r := range plan.Rules {
		if r.Allow && !slices.Contains(isolator.DefaultRules(), r) {
			native.rules = append(native.rules, r.String())
		}
	}
	for _, m := range plan.Mounts {
		native.mounts = append(native.mounts, m.Destination+" "+m.Source+" "+ro(m.Options))
	}
	native.env = envMap(isolator.MergeEnv(imageEnv, plan.Env))

	dc, err := dockerconfig.New(plan)
	if err != nil {
		t.Fatal(err)
	}
	cfg, hc := &container.Config{Env: slices.Clone(imageEnv)}, &container.HostConfig{}
	if err := dc.Apply(cfg, hc); err != nil {
		t.Fatal(err)
	}
	var dock rendering
	for _, d := range hc.Devices {
		dock.devices = append(dock.devices, d.PathInContainer)
		dock.hostPaths = append(dock.hostPaths, d.PathInContainer+" "+d.PathOnHost)
	}
	for _, m := range hc.Mounts {
		dock.mounts = append(dock.mounts, m.Target+" "+m.Source+" "+map[bool]string{true: "ro", false: "rw"}[m.ReadOnly])
	}
	dock.env = envMap(cfg.Env)
	dock.rules = hc.DeviceCgroupRules

	spec, err := cdi.Render(cdi.DefaultKind, plan)
	if err != nil {
		t.Fatal(err)
	}
	cdiSpec := base()
	for _, d := range spec.Devices {
		if err := (&cdilib.ContainerEdits{ContainerEdits: &d.ContainerEdits}).Apply(cdiSpec); err != nil {
			t.Fatal(err)
		}
	}
	viaCDI := fromOCI(cdiSpec)
	for _, d := range spec.Devices[0].ContainerEdits.DeviceNodes {
		viaCDI.hostPaths = append(viaCDI.hostPaths, d.Path+" "+d.HostPath)
	}

	var wantDevices, wantHost []string
	for _, d := range plan.Devices {
		wantDevices = append(wantDevices, d.Path)
		wantHost = append(wantHost, d.Path+" "+d.HostPath)
	}
	for name, got := range map[string][]string{"native": native.devices, "oci": ociView.devices, "docker": dock.devices, "cdi": viaCDI.devices} {
		if !slices.Equal(got, wantDevices) {
			t.Errorf("%s devices %v, want %v", name, got, wantDevices)
		}
	}
	if !slices.Equal(dock.hostPaths, wantHost) || !slices.Equal(viaCDI.hostPaths, wantHost) {
		t.Errorf("host paths: docker %v, cdi %v, want %v", dock.hostPaths, viaCDI.hostPaths, wantHost)
	}
	if !slices.Equal(native.numbers, viaCDI.numbers) || !slices.Equal(ociView.numbers, viaCDI.numbers) {
		t.Errorf("device numbers: native %v, oci %v, cdi %v", native.numbers, ociView.numbers, viaCDI.numbers)
	}
	var wantRules []string
	for _, r := range plan.Rules {
		if !slices.Contains(isolator.DefaultRules(), r) {
			wantRules = append(wantRules, r.String())
		}
	}
	if len(wantRules) != len(plan.Devices) {
		t.Errorf("plan rules %v: want one per node of %v", wantRules, plan.Devices)
	}
	for name, got := range map[string][]string{"native": native.rules, "oci": ociView.rules, "docker": dock.rules, "cdi": viaCDI.rules} {
		if !slices.Equal(slices.Sorted(slices.Values(got)), slices.Sorted(slices.Values(wantRules))) {
			t.Errorf("%s device rules %v, want %v", name, got, wantRules)
		}
	}
	wantMount := []string{volume.ContainerPath + " " + vol.Path + " ro"}
	for name, got := range map[string][]string{"native": native.mounts, "oci": ociView.mounts, "docker": dock.mounts, "cdi": viaCDI.mounts} {
		if !slices.Equal(got, wantMount) {
			t.Errorf("%s mounts %v, want %v", name, got, wantMount)
		}
	}

	visible := gpus[0].UUID + "," + gpus[1].UUID
	for name, env := range map[string]map[string]string{"native": native.env, "oci": ociView.env, "docker": dock.env, "cdi": viaCDI.env} {
		if env[isolator.EnvVisibleDevices] != visible || env[isolator.EnvCUDAVisibleDevices] != visible {
			t.Errorf("%s: %s=%q %s=%q, want both %q", name, isolator.EnvVisibleDevices, env[isolator.EnvVisibleDevices],
				isolator.EnvCUDAVisibleDevices, env[isolator.EnvCUDAVisibleDevices], visible)
		}
		if !strings.HasPrefix(env["PATH"], "/opt/tool/bin:/usr/bin:/bin") || !strings.HasPrefix(env["LD_LIBRARY_PATH"], "/opt/tool/lib") {
			t.Errorf("%s: PATH=%q LD_LIBRARY_PATH=%q lost the image's directories", name, env["PATH"], env["LD_LIBRARY_PATH"])
		}
		if env["TOOL"] != "1" {
			t.Errorf("%s: image variable TOOL lost", name)
		}
	}
	if !maps.Equal(native.env, dock.env) || !maps.Equal(native.env, ociView.env) {
		t.Errorf("environment: native %v, oci %v, docker %v", native.env, ociView.env, dock.env)
	}
	// CDI can only set variables: it agrees with the others on all but the
	// PATH-like ones, which it leaves as the image has them.
	for k, v := range native.env {
		want := v
		if isolator.IsPathList(k) {
			want = envMap(imageEnv)[k]
		}
		if viaCDI.env[k] != want {
			t.Errorf("cdi %s=%q, want %q", k, viaCDI.env[k], want)
		}
	}
}
