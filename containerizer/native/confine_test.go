package native

import (
	"errors"
	"path/filepath"
	"slices"
	"testing"

	"github.com/gpuiso/gpuiso/containerizer"
)

func TestConfinementOf(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name     string
		spec     containerizer.Spec
		wantCaps int
		bad      bool
	}{
		{name: "default", wantCaps: 14},
		{name: "cap added", spec: containerizer.Spec{CapAdd: []string{"SYS_PTRACE", "CAP_SYS_PTRACE", "chown"}}, wantCaps: 15},
		{name: "root file system", spec: containerizer.Spec{RootFS: dir}, wantCaps: 14},
		{name: "unknown cap", spec: containerizer.Spec{CapAdd: []string{"SYS_NOPE"}}, bad: true},
		{name: "relative root", spec: containerizer.Spec{RootFS: "rootfs"}, bad: true},
		{name: "missing root", spec: containerizer.Spec{RootFS: filepath.Join(dir, "missing")}, bad: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cf, err := confinementOf(tc.spec)
			if tc.bad {
				if !errors.Is(err, containerizer.ErrInvalidSpec) {
					t.Fatalf("confinementOf = %+v, %v; want ErrInvalidSpec", cf, err)
				}
				return
			}
			if err != nil || len(cf.Caps) != tc.wantCaps || !slices.IsSorted(cf.Caps) || cf.RootFS != tc.spec.RootFS {
				t.Fatalf("confinementOf = %+v, %v; want %d capabilities", cf, err, tc.wantCaps)
			}
		})
	}
}

func TestWantsVolume(t *testing.T) {
	for _, tc := range []struct {
		name string
		spec containerizer.Spec
		want bool
	}{
		{"host file system", containerizer.Spec{}, true},
		{"image without a request", containerizer.Spec{RootFS: "/r"}, false},
		{"visible devices", containerizer.Spec{RootFS: "/r", Env: []string{"NVIDIA_VISIBLE_DEVICES=all"}}, true},
		{"void", containerizer.Spec{RootFS: "/r", Env: []string{"NVIDIA_VISIBLE_DEVICES=void"}}, false},
		{"label", containerizer.Spec{RootFS: "/r", Labels: map[string]string{"com.nvidia.volumes.needed": "nvidia_driver"}}, true},
	} {
		if got := wantsVolume(tc.spec); got != tc.want {
			t.Errorf("%s: wantsVolume = %v, want %v", tc.name, got, tc.want)
		}
	}
}
