package volume

import (
	"reflect"
	"testing"
)

func TestNeedsVolume(t *testing.T) {
	tests := []struct {
		name string
		img  Image
		want bool
	}{
		{"nothing", Image{}, false},
		{"label", Image{Labels: map[string]string{LabelVolumesNeeded: "nvidia_driver"}}, true},
		{"all", env("NVIDIA_VISIBLE_DEVICES=all"), true},
		{"none: driver, no gpu", env("NVIDIA_VISIBLE_DEVICES=none"), true},
		{"list", env("NVIDIA_VISIBLE_DEVICES=0,GPU-abc"), true},
		{"empty", env("NVIDIA_VISIBLE_DEVICES="), false},
		{"void", env("NVIDIA_VISIBLE_DEVICES=void"), false},
		{"later void wins", env("NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=void"), false},
		{"other variable", env("NVIDIA_VISIBLE=all"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.img.NeedsVolume(); got != tt.want {
				t.Fatalf("NeedsVolume = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestInjection(t *testing.T) {
	v := &Volume{Version: "535.309.01", Path: "/var/run/gpuiso/volumes/nvidia_535.309.01"}
	tests := []struct {
		name   string
		env    []string
		compat bool
		want   []string
	}{
		{"empty image", nil, false, []string{
			"PATH=" + DefaultPath + ":/usr/local/nvidia/bin",
			"LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64",
		}},
		{"empty image with compat", nil, true, []string{
			"PATH=" + DefaultPath + ":/usr/local/nvidia/bin",
			"LD_LIBRARY_PATH=/usr/local/cuda/compat:/usr/local/nvidia/lib:/usr/local/nvidia/lib64",
		}},
		{"image paths kept in the middle", []string{"PATH=/opt/bin:/usr/bin", "LD_LIBRARY_PATH=/opt/lib"}, true, []string{
			"PATH=/opt/bin:/usr/bin:/usr/local/nvidia/bin",
			"LD_LIBRARY_PATH=/usr/local/cuda/compat:/opt/lib:/usr/local/nvidia/lib:/usr/local/nvidia/lib64",
		}},
		{"image's own compat entry taken out", []string{"LD_LIBRARY_PATH=/usr/local/cuda/compat/:/opt/lib"}, false, []string{
			"PATH=" + DefaultPath + ":/usr/local/nvidia/bin",
			"LD_LIBRARY_PATH=/opt/lib:/usr/local/nvidia/lib:/usr/local/nvidia/lib64",
		}},
		{"cuda image already has them", []string{
			"PATH=/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/bin",
			"LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64",
		}, true, []string{
			"PATH=/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/bin",
			"LD_LIBRARY_PATH=/usr/local/cuda/compat:/usr/local/nvidia/lib:/usr/local/nvidia/lib64",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			inj := v.InjectionCompat(tt.env, Compat{Use: tt.compat})
			if !tt.compat && !reflect.DeepEqual(v.Injection(tt.env), inj) {
				t.Errorf("Injection differs from InjectionCompat without compat")
			}
			if !reflect.DeepEqual(inj.Env, tt.want) {
				t.Errorf("env %q, want %q", inj.Env, tt.want)
			}
			want := Mount{Source: v.Path, Destination: "/usr/local/nvidia", Type: "bind", Options: []string{"rbind", "ro", "nosuid", "nodev"}}
			if !reflect.DeepEqual(inj.Mount, want) {
				t.Errorf("mount %+v, want %+v", inj.Mount, want)
			}
		})
	}
}
