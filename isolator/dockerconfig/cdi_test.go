package dockerconfig_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gpuiso/gpuiso/isolator/cdi"
	"github.com/gpuiso/gpuiso/isolator/dockerconfig"
	"github.com/gpuiso/gpuiso/node"
)

// TestApplyCDI renders the CDI path's request as the daemon receives it.
func TestApplyCDI(t *testing.T) {
	tests := []struct {
		name   string
		gpus   []node.DeviceRef
		mounts []specs.Mount
		env    []string
		want   string
	}{
		{"cdi-gpus-1-3-volume", gpus, []specs.Mount{vol}, env, dockerconfig.InjectionCDI},
		{"cdi-no-gpus", nil, nil, nil, dockerconfig.InjectionDevices},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := dockerconfig.NewCDI(plan(t, tt.gpus, tt.mounts, tt.env), cdi.DefaultKind)
			if err != nil {
				t.Fatal(err)
			}
			cfg, hc := base()
			hc.DeviceRequests = []container.DeviceRequest{{Driver: dockerconfig.CDIDriver, DeviceIDs: []string{"vendor.com/stale=0"}}}
			if err := c.Apply(cfg, hc); err != nil {
				t.Fatal(err)
			}
			got, err := json.MarshalIndent(struct {
				Env            []string
				Labels         map[string]string
				Devices        []container.DeviceMapping
				DeviceRequests []container.DeviceRequest
				Mounts         []mount.Mount
			}{cfg.Env, cfg.Labels, hc.Devices, hc.DeviceRequests, hc.Mounts}, "", "  ")
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
			if cfg.Labels[dockerconfig.LabelInjection] != tt.want {
				t.Errorf("injection %q, want %q", cfg.Labels[dockerconfig.LabelInjection], tt.want)
			}
			again, hcAgain := base()
			hcAgain.DeviceRequests = []container.DeviceRequest{{Driver: dockerconfig.CDIDriver, DeviceIDs: []string{"vendor.com/stale=0"}}}
			c.Apply(again, hcAgain)
			c.Apply(again, hcAgain)
			if !reflect.DeepEqual(again, cfg) || !reflect.DeepEqual(hcAgain, hc) {
				t.Fatal("applying twice differs from applying once")
			}
		})
	}
	if _, err := dockerconfig.NewCDI(plan(t, gpus, nil, nil), "nvidia"); !errors.Is(err, node.ErrInvalid) {
		t.Errorf("bad kind: %v", err)
	}
}

func TestCDISupported(t *testing.T) {
	dirs := []string{"/etc/cdi", "/var/run/cdi"}
	tests := []struct {
		api  string
		dirs []string
		want bool
	}{
		{"1.41", dirs, false}, // Docker 20.10
		{"1.43", dirs, false},
		{"1.44", dirs, true}, // Docker 25
		{"1.51", dirs, true},
		{"2.0", dirs, true},
		{"1.44", nil, false}, // CDI off in the daemon
		{"", dirs, false},
		{"1.x", dirs, false},
	}
	for _, tt := range tests {
		if got := dockerconfig.CDISupported(tt.api, tt.dirs); got != tt.want {
			t.Errorf("CDISupported(%q, %v) = %v, want %v", tt.api, tt.dirs, got, tt.want)
		}
	}
}
