package dockerconfig_test

import (
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/isolator/dockerconfig"
	"github.com/gpuiso/gpuiso/node"
)

var update = flag.Bool("update", false, "rewrite testdata/*.json")

// testInv is two GPUs of a DGX-1-like node and its control devices.
var testInv = &node.Inventory{
	Devices: []node.Device{
		{Index: 1, Minor: 1, Node: node.DeviceNode{Path: "/srv/node/dev/nvidia1", Major: 195, Minor: 1}, UUID: "GPU-11111111-1111-1111-1111-111111111111", Health: node.Healthy()},
		{Index: 3, Minor: 3, Node: node.DeviceNode{Path: "/srv/node/dev/nvidia3", Major: 195, Minor: 3}, UUID: "GPU-33333333-3333-3333-3333-333333333333", Health: node.Healthy()},
	},
	ControlDevices: []node.ControlDevice{
		{Name: "nvidiactl", Path: "/srv/node/dev/nvidiactl", Major: 195, Minor: 255},
		{Name: "nvidia-uvm", Path: "/srv/node/dev/nvidia-uvm", Major: 510, Minor: 0},
		{Name: "nvidia-uvm-tools", Path: "/srv/node/dev/nvidia-uvm-tools", Major: 510, Minor: 1},
	},
}

var (
	gpus = []node.DeviceRef{{Index: 1, Minor: 1, Node: node.DeviceNode{Path: "/srv/node/dev/nvidia1", Major: 195, Minor: 1}, UUID: testInv.Devices[0].UUID}, {Index: 3, Minor: 3, Node: node.DeviceNode{Path: "/srv/node/dev/nvidia3", Major: 195, Minor: 3}, UUID: testInv.Devices[1].UUID}}
	vol  = specs.Mount{Destination: "/usr/local/nvidia", Type: "bind", Source: "/var/run/gpuiso/volumes/nvidia_535.104.05", Options: []string{"rbind", "ro", "nosuid", "nodev"}}
	env  = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/usr/local/nvidia/bin", "LD_LIBRARY_PATH=/usr/local/cuda/compat:/usr/local/nvidia/lib:/usr/local/nvidia/lib64"}
)

func plan(t *testing.T, gpus []node.DeviceRef, mounts []specs.Mount, env []string) *isolator.Plan {
	t.Helper()
	p, err := isolator.NewPlan("task-1", testInv, gpus, mounts, env)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// base is what a containerizer starts from: the image and the user's
// command and environment, one device of their own and a volume at the
// driver's path that the plan must replace.
func base() (*container.Config, *container.HostConfig) {
	cfg := &container.Config{Image: "nvidia/cuda:12.2.0-base", Cmd: []string{"nvidia-smi"}, Env: []string{"TERM=xterm", "NVIDIA_VISIBLE_DEVICES=all"}, Labels: map[string]string{"team": "ml"}}
	hc := &container.HostConfig{}
	hc.Devices = []container.DeviceMapping{{PathOnHost: "/dev/fuse", PathInContainer: "/dev/fuse", CgroupPermissions: "rwm"}}
	return cfg, hc
}

func TestApply(t *testing.T) {
	tests := []struct {
		name   string
		gpus   []node.DeviceRef
		mounts []specs.Mount
		env    []string
	}{
		{"gpus-1-3-volume", gpus, []specs.Mount{vol}, env},
		{"gpu-3-no-volume", gpus[1:], nil, nil},
		{"no-gpus", nil, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := dockerconfig.New(plan(t, tt.gpus, tt.mounts, tt.env))
			if err != nil {
				t.Fatal(err)
			}
			cfg, hc := base()
			if err := c.Apply(cfg, hc); err != nil {
				t.Fatal(err)
			}
			// The parts of the configuration a plan touches, as the daemon
			// receives them.
			got, err := json.MarshalIndent(struct {
				Image   string
				Cmd     []string
				Env     []string
				Labels  map[string]string
				Devices []container.DeviceMapping
				Mounts  []mount.Mount
			}{cfg.Image, cfg.Cmd, cfg.Env, cfg.Labels, hc.Devices, hc.Mounts}, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			golden := filepath.Join("testdata", tt.name+".json")
			if *update {
				if err := os.WriteFile(golden, append(got, '\n'), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatal(err)
			}
			if string(got)+"\n" != string(want) {
				t.Fatalf("configuration differs from %s (go test -update rewrites it):\n%s", golden, got)
			}

			again, hcAgain := base()
			c.Apply(again, hcAgain)
			c.Apply(again, hcAgain)
			if !reflect.DeepEqual(again, cfg) || !reflect.DeepEqual(hcAgain, hc) {
				t.Fatal("applying twice differs from applying once")
			}

			owner, back, err := dockerconfig.ParseLabels(cfg.Labels)
			if err != nil || owner != "task-1" || len(back) != len(tt.gpus) {
				t.Fatalf("ParseLabels = %q, %v, %v; want task-1 and %v", owner, back, err, tt.gpus)
			}
			for i := range back {
				if back[i] != tt.gpus[i] {
					t.Fatalf("ParseLabels GPU %d = %+v, want %+v", i, back[i], tt.gpus[i])
				}
			}
		})
	}
}

func TestNewRejects(t *testing.T) {
	good := plan(t, gpus, []specs.Mount{vol}, env)
	tests := []struct {
		name string
		edit func(p *isolator.Plan)
	}{
		{"no host path", func(p *isolator.Plan) { p.Devices[0].HostPath = "" }},
		{"no container path", func(p *isolator.Plan) { p.Devices[1].Path = "" }},
		{"tmpfs mount", func(p *isolator.Plan) { p.Mounts = []specs.Mount{{Destination: "/x", Type: "tmpfs", Source: "tmpfs"}} }},
		{"bind without source", func(p *isolator.Plan) { p.Mounts[0].Source = "" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := *good
			p.Devices = append([]isolator.DeviceNode(nil), good.Devices...)
			p.Mounts = append([]specs.Mount(nil), good.Mounts...)
			tt.edit(&p)
			if c, err := dockerconfig.New(&p); !errors.Is(err, dockerconfig.ErrInvalidPlan) || c != nil {
				t.Fatalf("New = %+v, %v; want ErrInvalidPlan", c, err)
			}
		})
	}
	if _, err := dockerconfig.New(nil); !errors.Is(err, dockerconfig.ErrInvalidPlan) {
		t.Fatalf("New(nil) = %v", err)
	}
}

func TestApplyRejectsNil(t *testing.T) {
	c, err := dockerconfig.New(plan(t, gpus, nil, nil))
	if err != nil {
		t.Fatal(err)
	}
	cfg, _ := base()
	before := *cfg
	if err := c.Apply(cfg, nil); !errors.Is(err, dockerconfig.ErrNilConfig) {
		t.Fatalf("Apply(cfg, nil) = %v", err)
	}
	if !reflect.DeepEqual(*cfg, before) {
		t.Fatal("a refused Apply changed the configuration")
	}
}

func TestParseLabelsRejects(t *testing.T) {
	tests := []struct {
		name   string
		labels map[string]string
	}{
		{"not ours", map[string]string{"team": "ml"}},
		{"bad owner", map[string]string{dockerconfig.LabelOwner: "../x", dockerconfig.LabelGPUs: "[]"}},
		{"no gpus label", map[string]string{dockerconfig.LabelOwner: "task-1"}},
		{"gpus not json", map[string]string{dockerconfig.LabelOwner: "task-1", dockerconfig.LabelGPUs: "0,1"}},
		{"gpu without uuid", map[string]string{dockerconfig.LabelOwner: "task-1", dockerconfig.LabelGPUs: `[{"index":1,"minor":1}]`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := dockerconfig.ParseLabels(tt.labels)
			var le *dockerconfig.LabelError
			if !errors.Is(err, dockerconfig.ErrInvalidLabels) || !errors.As(err, &le) {
				t.Fatalf("ParseLabels = %v; want a *LabelError", err)
			}
		})
	}
}
